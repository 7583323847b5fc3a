"""Gateway <-> replica: what they say to each other through Redis, defined once for both ends
(the web process's gateway and the replica process). Torch-free and Django-free.

- The replica reads its **request stream** `switchyard:replica:<id>:requests` (XADD, one JSON
  message in the entry's field `m`): from the gateway, `GenerateMessage` (a prompt as text,
  token ids or chat messages, `WireSamplingParams` and the pub/sub channel to answer on) and
  `AbortMessage` (the client went away); between the replicas of a disaggregated deployment,
  `PrefillMessage`, `PrefilledMessage` and `PrefillFailedMessage` (see workers/replica/disagg.py).
  A `generate` may ask `return_prompt_token_ids` (the gateway keeps them to resume the request
  elsewhere), and a resumed one carries `Resume`: the last N of its `prompt_token_ids` are output
  another replica generated, M characters of whose text the client already has.
- It answers each request on the request's **reply channel** (pub/sub), one JSON event per
  message, in order: `AcceptedEvent` (prompt tokenised), `DeltaEvent`s (new text, token ids,
  logprobs; the last carries `finish_reason`, `usage` and `timings`), or an `ErrorEvent` (`status`,
  `message`, `param`, `code`; e.g. 400 for a prompt over the context). `read_event` reads one.
- It reports itself in the **status hash** `switchyard:replica:<id>:status`: `ReplicaStatus`
  (state, load, endpoint, metrics, heartbeat, incarnation, kv_block_size). The node agent's
  supervisor mirrors it into the database; the gateway reads it to route and to notice a replica
  lost mid-request. Which KV blocks it holds is a set of its own (workers/protocol/kv_blocks.py).
- `ReplicaSpec`: everything a replica process starts with (its speculation: `SpeculativeSpec`; its
  KV tiers: `KVTiersSpec`).

Every message, event and status carries a `version`: a side refuses one newer than its own
(`ProtocolError`) and ignores fields it does not know, so a field can be added without a new
version. `to_wire` is `Wire`'s (workers/protocol/wire.py: shallow, None left out) unless a
message's shape differs; `DeltaEvent` writes its JSON object by hand, since a replica sends one
delta per request per engine step.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypedDict

from workers.protocol.wire import ProtocolError, Wire, check_version, expect_object, from_wire

VERSION = 1
# ReplicaSpec's own: 2 renamed `model` to `model_dir` and `extra` to `cuda_devices`, so an agent
# that reads version 1 would start a replica without its model (it refuses version 2 instead).
REPLICA_SPEC_VERSION = 2
# A replica whose heartbeat is older than this is not sent new requests, and the streams of
# its requests in flight end with an error.
HEARTBEAT_INTERVAL = 0.5
HEARTBEAT_STALE_SECONDS = 3.0
REQUEST_STREAM_MAXLEN = 10_000


def status_key(replica_id: int) -> str:
    return f"switchyard:replica:{replica_id}:status"


def requests_key(replica_id: int) -> str:
    return f"switchyard:replica:{replica_id}:requests"


# One encoder: json.dumps with any option builds a new JSONEncoder per call, which costs about
# as much as typing an event does.
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def encode(message: dict) -> str:
    """A message's `to_wire()` as the JSON that travels (compact: it is sent per token)."""
    return _ENCODER.encode(message)


def decode(raw: str | bytes) -> dict:
    return json.loads(raw)


class MessageError(ProtocolError):
    """A `generate` the replica can answer but not serve as sent: `param` names the request
    parameter at fault, as the client knows it (`prompt`, `params`, `resume`, a sampling
    parameter), so the error event can tell the client what to fix."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


# -- sampling parameters ---------------------------------------------------------------------


@dataclass
class WireSamplingParams(Wire):
    """The sampling parameters a `generate` carries: exactly what the gateway may send. The
    gateway's parser fills and range-checks them; the engine's `SamplingParams.from_wire` builds
    its own from them and checks every value again (a replica trusts no sender). Nothing is
    checked here but the names: an unknown one is refused, never dropped, since a parameter
    silently ignored would change the answer. The defaults are the engine's."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to the context
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # top-N logprobs per generated token (the sampled one is always included)
    # Structured output: what the output must match ({"type": "json_schema", "schema": ...},
    # see workers/engine/structured.py); the engine checks the shape and compiles it.
    grammar: dict | None = None
    # Samples of the prompt; each delta names its sample (`DeltaEvent.index`), each sample ends
    # with its own final delta.
    n: int = 1
    # OpenAI's logit_bias: token id (a string key in JSON) -> bias in [-100, 100].
    logit_bias: dict | None = None

    def to_wire(self) -> dict:
        """Every parameter, None included (`max_tokens` None means up to the context)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_wire(cls, data: Any) -> WireSamplingParams:
        if not isinstance(data, dict):
            raise MessageError("sampling parameters must be an object", "params")
        unknown = sorted(set(data) - SAMPLING_NAMES)
        if unknown:
            raise MessageError(f"unknown sampling parameter {unknown[0]!r}", unknown[0])
        return cls(**data)


SAMPLING_NAMES = frozenset(f.name for f in fields(WireSamplingParams))


# -- gateway -> replica ----------------------------------------------------------------------

# Priorities, lower first (vLLM's `priority`): clients may ask within +-PRIORITY_LIMIT; batch
# lines run below anything a client can ask.
PRIORITY_LIMIT = 100
BATCH_PRIORITY = 1000
MAX_TENANT_WEIGHT = 1000.0


@dataclass(frozen=True)
class Share(Wire):
    """How the engine weighs a request against the others it holds: its `priority` (lower runs
    first, and preempts higher), the `tenant` it is served for (the API key's owner) and that
    tenant's `weight` (its share of the engine relative to the others, see scheduler.py)."""

    priority: int = 0
    tenant: str = ""
    weight: float = 1.0

    @classmethod
    def from_wire(cls, data: Any) -> Share:
        if not isinstance(data, dict):
            raise MessageError("share must be an object", "share")
        priority, tenant, weight = data.get("priority", 0), data.get("tenant", ""), data.get("weight", 1.0)
        if type(priority) is not int or not -BATCH_PRIORITY <= priority <= BATCH_PRIORITY:
            raise MessageError(f"priority must be an integer in [-{BATCH_PRIORITY}, {BATCH_PRIORITY}]", "priority")
        if not isinstance(tenant, str) or len(tenant) > 200:
            raise MessageError("share.tenant must be a string of at most 200 characters", "share")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight <= MAX_TENANT_WEIGHT:
            raise MessageError(f"share.weight must be a number in (0, {MAX_TENANT_WEIGHT:g}]", "share")
        return cls(priority, tenant, float(weight))


DEFAULT_SHARE = Share()  # priority 0, no tenant


@dataclass
class Resume(Wire):
    """A request resumed on this replica: the last `output_tokens` of its `prompt_token_ids` are
    output another replica generated, of whose text `text_sent` characters reached the client."""

    output_tokens: int
    text_sent: int = 0

    def to_wire(self) -> dict:
        return {"output_tokens": self.output_tokens, "text_sent": self.text_sent}

    @classmethod
    def from_wire(cls, data: Any) -> Resume:
        if not isinstance(data, dict):
            raise MessageError("resume must be an object", "resume")
        count, sent = data.get("output_tokens"), data.get("text_sent", 0)
        for name, value in (("output_tokens", count), ("text_sent", sent)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise MessageError(f"resume.{name} must be an integer >= 0", "resume")
        return cls(count, sent)


@dataclass
class GenerateMessage(Wire):
    """`generate`: one completion. The prompt is `messages` (chat, with the `tools` its template
    renders), `prompt_token_ids`, or `prompt` (text), in that order of precedence. The gateway
    builds one before it knows where it goes: `id` and `reply_to` are filled in when it is sent,
    and `prefill_replica` when the router picked one."""

    TYPE: ClassVar[str] = "generate"

    id: str = ""
    reply_to: str = ""  # the pub/sub channel of the request's events
    params: WireSamplingParams = field(default_factory=WireSamplingParams)
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[dict] | None = None
    tools: list[dict] | None = None
    # Disaggregated: the prefill replica to hand the prompt to. On the wire
    # `"prefill": {"replica_id": n}`; a malformed one is ignored (the replica prefills itself).
    prefill_replica: int | None = None
    return_prompt_token_ids: bool = False
    resume: Resume | None = None
    # The client gave a session key (header, `prompt_cache_key`, the websocket's `session`): the
    # next turn will start with this one's context, so the replica shares its KV through the store.
    session_turn: bool = False
    share: Share = DEFAULT_SHARE
    version: int = VERSION

    @property
    def chat(self) -> bool:
        return self.messages is not None

    def to_wire(self) -> dict:
        out: dict[str, Any] = {
            "type": self.TYPE,
            "id": self.id,
            "reply_to": self.reply_to,
            "version": self.version,
            "params": self.params.to_wire(),
        }
        for name in ("messages", "tools", "prompt_token_ids", "prompt"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.prefill_replica is not None:
            out["prefill"] = {"replica_id": self.prefill_replica}
        if self.return_prompt_token_ids:
            out["return_prompt_token_ids"] = True
        if self.resume is not None:
            out["resume"] = self.resume.to_wire()
        if self.session_turn:
            out["session_turn"] = True
        if self.share != DEFAULT_SHARE:
            out["share"] = self.share.to_wire()
        return out

    @classmethod
    def from_wire(cls, data: Any) -> GenerateMessage:
        """Raises ProtocolError for a message that cannot be answered at all (no id or reply_to)
        or read (a newer version), MessageError for one to answer with a 400 naming the
        parameter. Checks shapes only, in the order the replica always has (sampling parameters
        first); values are the engine's to check."""
        check_version(cls, expect_object(cls, data))
        rid, reply_to = data.get("id"), data.get("reply_to")
        if not (isinstance(rid, str) and rid and isinstance(reply_to, str) and reply_to):
            raise ProtocolError("GenerateMessage: id and reply_to must be non-empty strings")
        resume = data.get("resume")
        return cls(
            id=rid,
            reply_to=reply_to,
            params=WireSamplingParams.from_wire(data.get("params") or {}),
            messages=_typed(data, "messages", list, "a list", "messages"),
            tools=_typed(data, "tools", list, "a list", "tools"),
            prompt_token_ids=_token_ids(data.get("prompt_token_ids")),
            prompt=_typed(data, "prompt", str, "a string", "prompt"),
            prefill_replica=_prefill_replica(data.get("prefill")),
            return_prompt_token_ids=data.get("return_prompt_token_ids") is True,
            resume=None if resume is None else Resume.from_wire(resume),
            session_turn=data.get("session_turn") is True,
            share=DEFAULT_SHARE if data.get("share") is None else Share.from_wire(data["share"]),
        )


def _typed(data: dict, name: str, kind: type, what: str, param: str):
    value = data.get(name)
    if value is not None and not isinstance(value, kind):
        raise MessageError(f"{name} must be {what}, got {type(value).__name__}", param)
    return value


def _token_ids(value: Any) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(type(t) is int for t in value):
        raise MessageError("prompt_token_ids must be a list of integers", "prompt")
    return value


def _prefill_replica(value: Any) -> int | None:
    replica = value.get("replica_id") if isinstance(value, dict) else None
    return replica if type(replica) is int else None


@dataclass
class AbortMessage(Wire):
    """`abort`: the client went away; drop the request and free what it holds."""

    TYPE: ClassVar[str] = "abort"

    id: str
    version: int = VERSION


# -- replica -> gateway: events on the reply channel -----------------------------------------


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int  # resumed output included
    cached_tokens: int  # prompt tokens served from the prefix cache


class Timings(TypedDict, total=False):
    ttft_ms: float  # arrival at the replica -> first token
    total_ms: float
    # The request's phases (the gateway's trace draws them): waiting to be scheduled, the prompt
    # to the first token, the first token to the last.
    queue_ms: float
    prefill_ms: float
    decode_ms: float
    grammar_ms: float  # compiling its grammar at admission (a cached one: about nothing)


class TopLogprob(TypedDict):
    id: int
    token: str
    logprob: float


class TokenLogprob(TypedDict):
    id: int  # the sampled token
    token: str
    logprob: float
    top: list[TopLogprob]  # the request's top-N, best first


class Disaggregation(TypedDict, total=False):
    prefill: dict  # {"replica": id, "transfer_ms": ms}: a prefill replica computed the prompt
    fallback: str  # why this (decode) replica computed it after all


@dataclass(slots=True)
class AcceptedEvent(Wire):
    """The prompt is tokenised and fits: the request runs. `prompt_token_ids` when the
    `generate` asked for them; `prefill_replica` when the prompt was handed to one."""

    TYPE: ClassVar[str] = "accepted"
    final: ClassVar[bool] = False

    id: str
    prompt_tokens: int
    prompt_token_ids: list[int] | None = None
    prefill_replica: int | None = None
    version: int = VERSION


@dataclass(slots=True)
class DeltaEvent(Wire):
    """New output of one engine step. The first one of a request on a replica carries `timings`
    of the phases so far (queue, prefill, grammar) and, on a disaggregated deployment,
    `disaggregation`: a request that then moves to another replica keeps them in its trace. The
    last one (`final`) carries `finish_reason`, `stop_reason` (the stop string or token id that
    ended it, if any), `usage`, and `timings` and `disaggregation` in full."""

    TYPE: ClassVar[str] = "delta"

    id: str
    text: str
    token_ids: list[int]
    t: float | None = None  # wall clock when the tokens left the engine: delivery latency is measured from it
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    disaggregation: Disaggregation | None = None
    index: int = 0  # the sample (choice) of an `n` > 1 request these tokens belong to
    version: int = VERSION

    @property
    def final(self) -> bool:
        """The last delta of its sample (a request of `n` samples has `n` of them)."""
        return self.finish_reason is not None

    def to_wire(self) -> dict:
        out: dict[str, Any] = {
            "type": "delta",
            "id": self.id,
            "version": self.version,
            "text": self.text,
            "token_ids": self.token_ids,
        }
        if self.t is not None:
            out["t"] = self.t
        if self.index:
            out["index"] = self.index
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        if self.finish_reason is not None:
            out["finish_reason"] = self.finish_reason
            out["stop_reason"] = self.stop_reason
            out["usage"] = self.usage
            out["timings"] = self.timings
        elif self.timings is not None:
            out["timings"] = self.timings
        if self.disaggregation:
            out["disaggregation"] = self.disaggregation
        return out

    @classmethod
    def from_wire(cls, data: Any) -> DeltaEvent:
        if not (isinstance(data, dict) and isinstance(data.get("id"), str)):
            raise ProtocolError("DeltaEvent: expected an object with a string id")
        if data.get("version", VERSION) != VERSION:  # read per token: the usual case costs one lookup
            check_version(cls, data)
        get = data.get
        return cls(
            data["id"],
            get("text") or "",
            get("token_ids") or [],
            get("t"),
            get("logprobs"),
            get("finish_reason"),
            get("stop_reason"),
            get("usage"),
            get("timings"),
            get("disaggregation"),
            get("index") or 0,
        )


@dataclass(slots=True)
class ErrorEvent(Wire):
    """The request ended, or was never admitted. `status` is HTTP's: 400 for the request's own
    fault (`param` names the parameter, `code` is OpenAI's: `invalid_value`,
    `context_length_exceeded`), 503 when the replica is draining (the gateway tries another),
    500 for the replica failing: code `engine_error` when the engine failed while stepping this
    request alone (the others carry on; resumed elsewhere it would fail the same way)."""

    TYPE: ClassVar[str] = "error"
    final: ClassVar[bool] = True

    id: str
    status: int
    message: str
    param: str | None = None
    code: str | None = None
    version: int = VERSION


ENGINE_ERROR = "engine_error"  # ErrorEvent.code: the engine failed on this one request

Event = AcceptedEvent | DeltaEvent | ErrorEvent
EVENTS: dict[str, type[Event]] = {cls.TYPE: cls for cls in (AcceptedEvent, DeltaEvent, ErrorEvent)}


def read_event(data: Any) -> Event:
    """One event off a reply channel, by its `type`; ProtocolError if this side cannot read it."""
    if not isinstance(data, dict):
        raise ProtocolError(f"a replica event must be an object, got {type(data).__name__}")
    kind = data.get("type")
    cls = EVENTS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"not a replica event: type {kind!r}"[:120])
    return cls.from_wire(data)


# -- replica <-> replica: the prefill handoff of a disaggregated deployment ------------------


@dataclass
class PrefillMessage(Wire):
    """Decode replica -> prefill replica: compute this prompt and write its KV into my
    `blocks` (Mooncake endpoint and KV layout in `kv`) before `deadline` (unix time); answer on
    `reply_stream` (my request stream)."""

    TYPE: ClassVar[str] = "prefill"

    id: str
    prompt_token_ids: list[int]
    params: WireSamplingParams
    kv: dict
    blocks: list[int]
    reply_stream: str
    deadline: float
    session_turn: bool = False  # as the request's GenerateMessage said: the prefill replica shares it
    share: Share = DEFAULT_SHARE  # the request's: the prefill replica queues it by the same rules
    version: int = VERSION

    @classmethod
    def from_wire(cls, data: Any) -> PrefillMessage:
        message = from_wire(cls, data)  # reads `params` as WireSamplingParams, `share` as Share
        if not isinstance(message.params, WireSamplingParams):  # absent as null: the defaults
            message.params = WireSamplingParams.from_wire(message.params or {})
        return message


@dataclass
class PrefilledMessage(Wire):
    """Prefill replica -> decode replica: the KV is written; the first token (its logprobs by
    token id, as strings: JSON keys) and how many prompt tokens came from the prefix cache."""

    TYPE: ClassVar[str] = "prefilled"

    id: str
    first_token: int
    logprobs: dict[str, float] | None = None
    cached_tokens: int = 0
    bytes: int = 0
    transfer_ms: float | None = None
    version: int = VERSION


@dataclass
class PrefillFailedMessage(Wire):
    """Prefill replica -> decode replica: nothing was written (`reason`); prefill it yourself."""

    TYPE: ClassVar[str] = "prefill_failed"

    id: str
    reason: str = "prefill failed"
    version: int = VERSION


HANDOFF_MESSAGES: dict[str, type[PrefillMessage | PrefilledMessage | PrefillFailedMessage]] = {
    cls.TYPE: cls for cls in (PrefillMessage, PrefilledMessage, PrefillFailedMessage)
}


# -- the status hash -------------------------------------------------------------------------


class Progress(TypedDict):
    stage: str  # "loading weights"...
    fraction: float


class KVTierCounters(TypedDict):
    """One KV tier of a replica (workers/kvtiers), since the replica started. For the store,
    `used_bytes` / `capacity_bytes` are the shared store's as this replica sees them."""

    hits: int  # blocks found
    misses: int  # blocks looked up and not found (a checksum failure is a miss too)
    bytes_read: int
    bytes_written: int
    read_seconds: float
    write_seconds: float
    checksum_failures: int  # blocks whose bytes did not match their checksum: never used
    errors: int  # calls that failed (the store unreachable...)
    evictions: int  # blocks dropped to stay within the budget
    used_bytes: int
    capacity_bytes: int
    available: bool  # false while the tier cannot be reached (the store's master down)


class KVTiersLoad(TypedDict):
    """`load["kv_tiers"]` of a replica with KV tiers (absent otherwise): `LLMEngine.tier_stats()`."""

    tiers: dict[str, KVTierCounters]  # by tier: "dram", "store", "disk" (those it has)
    blocks_loaded: dict[str, int]  # prompt blocks admissions took from each tier instead of computing
    load_seconds: float  # time the store and disk loads took (off the engine's thread)
    dropped_writes: int  # blocks not written to a tier because its writes fell behind
    loads_inflight: int  # requests waiting on a tier load now


class ReplicaLoad(TypedDict, total=False):
    role: str
    running: int
    waiting: int
    kv_blocks_total: int
    kv_blocks_free: int
    tokens_per_second: float
    prefix_cache_hits: int
    prefix_cache_queries: int
    preemptions: int  # running sequences preempted since the replica started (recomputed later)
    # prefill and decode roles
    prefill_tokens_inflight: int
    kv_writes_inflight: int
    handoffs_waiting: int
    kv_transfer: dict  # KV transfer counters
    kv_tiers: KVTiersLoad  # replicas with KV tiers
    # Per rank (one entry on a single device), measured after load: bytes of weights, KV cache
    # and the rest of the process ({"rank", "weights", "kv_cache", "other"}).
    rank_memory: list[dict]


class SpeculativeMetrics(TypedDict, total=False):
    """`metrics["speculative"]` of a replica that speculates (absent otherwise): its engine's
    counters since the process started. Position j (0-based) of a draft run is its j+1-th
    guess; a run's accepted guesses are a prefix of its drafted ones."""

    method: str
    num_drafts: int  # draft runs verified (one per sequence per verifying step)
    num_verify_steps: int  # engine steps that verified at least one draft
    drafted_per_position: list[int]  # draft runs that reached position j
    accepted_per_position: list[int]  # ... and whose guess at position j was accepted
    verify_seconds: float  # time in steps that verified drafts
    draft_seconds: float  # time proposing drafts
    chosen_k: list[int]  # method auto (k measured): sequences given k guesses by the choice, by k
    # k measured, over the steps the choice drafted in: "expected_plain" / "expected" seconds is the
    # speed-up the cost model expected, "measured_plain" / "measured" the one measured (plain:
    # what those steps' tokens would have cost in plain decode steps).
    gain_seconds: dict[str, float]


class Endpoint(TypedDict, total=False):
    stream: str  # the request stream
    pid: int
    max_model_len: int
    kv_session: str  # prefill and decode roles: the Mooncake session


_JSON_FIELDS = ("progress", "load", "endpoint", "metrics")


@dataclass
class ReplicaStatus:
    """What a replica reports of itself, in its status hash (the replica is its one writer).
    `state`: loading -> ready -> draining -> stopped ("" when it has reported nothing).
    `progress` while loading; `load`, `endpoint`, `metrics` (ReplicaMetrics: counters and
    histograms), `incarnation` (changes with each process start) and `kv_block_size` (tokens per
    KV block, for prefix-aware routing: workers.protocol.kv_blocks; 0 when not reported) once it
    serves. A field left empty is not written, so what an earlier write put there stays."""

    state: str = ""
    heartbeat: float = 0.0  # unix time of the last report
    incarnation: str = ""
    progress: Progress | None = None
    load: ReplicaLoad = field(default_factory=dict)  # type: ignore[assignment]
    endpoint: Endpoint = field(default_factory=dict)  # type: ignore[assignment]
    metrics: dict = field(default_factory=dict)
    kv_block_size: int = 0
    version: int = VERSION

    def is_fresh(self, now: float | None = None) -> bool:
        """True while the heartbeat is recent: the replica is alive."""
        return (now or time.time()) - self.heartbeat < HEARTBEAT_STALE_SECONDS

    @property
    def serving(self) -> bool:
        return self.state in ("ready", "draining")

    def to_hash(self) -> dict[str, str]:
        out = {"state": self.state, "heartbeat": f"{self.heartbeat:.3f}", "version": str(self.version)}
        if self.incarnation:
            out["incarnation"] = self.incarnation
        if self.kv_block_size:
            out["kv_block_size"] = str(self.kv_block_size)
        for name in _JSON_FIELDS:
            value = getattr(self, name)
            if value:
                out[name] = encode(value)
        return out

    @classmethod
    def from_hash(cls, raw: dict) -> ReplicaStatus:
        """The status from the hash as read (`{}` when there is none: state ""). A garbled field
        reads as empty; ProtocolError when it was written by a newer replica."""
        version = raw.get("version")
        if version is not None:
            try:
                version = int(version)
            except ValueError:
                raise ProtocolError(f"ReplicaStatus: version must be an integer, got {version!r}"[:120]) from None
            check_version(cls, {"version": version})
        try:
            heartbeat = float(raw.get("heartbeat") or 0)
        except ValueError:
            heartbeat = 0.0
        try:
            kv_block_size = max(int(raw.get("kv_block_size") or 0), 0)
        except ValueError:
            kv_block_size = 0
        status = cls(
            state=raw.get("state") or "",
            heartbeat=heartbeat,
            incarnation=raw.get("incarnation") or "",
            kv_block_size=kv_block_size,
        )
        for name in _JSON_FIELDS:
            if raw.get(name):
                try:
                    value = json.loads(raw[name])
                except ValueError:
                    continue
                if isinstance(value, dict):
                    setattr(status, name, value)
        return status


# -- what a replica starts with --------------------------------------------------------------


@dataclass
class SpeculativeSpec(Wire):
    """A replica's speculative decoding: `method` "ngram" (drafts from the prompt and output),
    "eagle3" (an EAGLE-3 head in `draft_model`, a directory on the replica's node) or "auto"
    (prompt lookup, the head if `draft_model` is set, k per step from measured costs), with
    `num_speculative_tokens` drafted per step (auto's most). Only colocated and decode replicas
    speculate."""

    method: str
    num_speculative_tokens: int
    draft_model: str | None = None

    def engine_config(self) -> dict:
        """The engine's `speculative_config`, in vLLM's spelling (workers/engine/speculative/config.py)."""
        out: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.draft_model:
            out["model"] = self.draft_model
        return out


@dataclass
class KVTiersSpec(Wire):
    """A replica's KV tiers behind its device prefix cache (workers/engine/tiered_cache.py): host
    DRAM (`dram_bytes`), a disk directory with a byte budget (`disk_path`, `disk_bytes`) and the
    fleet's Mooncake Store (`store_master`, "host:port" of its mooncake_master), loads from the
    last two only for prefixes of at least `min_prefix_tokens`. The control plane fills these from
    the deployment's cache policy. The node agent fills what is its machine's: `local_hostname`
    (how other store clients reach this replica: the node's KV transfer host), `store_protocol`
    ("tcp" or "rdma"), `store_device` (RDMA device names) and `store_segment_bytes` (memory the
    replica lends the store); left empty, the engine's defaults hold."""

    dram_bytes: int = 0
    disk_path: str = ""
    disk_bytes: int = 0
    store_master: str = ""
    store_metrics: str = ""  # "host:port" of the master's metrics: the pool's capacity and use
    min_prefix_tokens: int = 0
    local_hostname: str = ""
    store_protocol: str = ""
    store_device: str = ""
    store_segment_bytes: int = 0

    def engine_config(self) -> dict:
        """The engine's `kv_tiers` (KVTierConfig's keys): what is set, so unset ones keep the engine's default."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}


@dataclass
class ReplicaSpec(Wire):
    """Everything a replica process needs to start. The control worker builds it from the
    database and sends it to the node agent (workers.protocol.control), which fills in what is
    its machine's (Redis URL, KV transfer address, threads) and writes it as JSON next to the
    replica's log: the replica never reads the database."""

    replica_id: int
    deployment: str
    model_dir: str  # where the checkpoint is on this node (a Hugging Face directory)
    model_name: str  # the name clients ask for
    role: str = "colocated"
    device: str = "cpu"
    dtype: str = "auto"
    block_size: int = 16
    enable_prefix_caching: bool = True
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048  # per-step token budget: the prefill chunk size
    fair_share: bool = True  # EngineConfig.fair_share: admit by tenant within a priority
    max_model_len: int | None = None
    kv_cache_bytes: int = 512 << 20
    threads: int = 0  # torch threads on CPU; 0 keeps torch's default
    # Disaggregated roles: how KV blocks move (Mooncake Transfer Engine).
    kv_protocol: str = "tcp"
    kv_host: str = "127.0.0.1"
    kv_transfer_timeout: float = 2.0
    # A decode replica prefills prompts shorter than this itself: moving their KV costs more
    # than computing it, and their prefill barely delays the running batch.
    local_prefill_tokens: int = 256
    redis_url: str = "redis://127.0.0.1:6379/0"
    speculative: SpeculativeSpec | None = None  # None: no speculation
    kv_tiers: KVTiersSpec | None = None  # None: the device prefix cache alone
    # One process per device (the engine's parallel/): this process is rank 0 and starts the
    # others on the replica's devices in order (CUDA_VISIBLE_DEVICES), rank r on device r.
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    # "sim": the simulated engine (workers/sim), its step times from `sim_profile` (a profile's
    # fields, workers/sim/profile.py); "real": the model.
    engine: str = "real"
    sim_profile: dict | None = None
    # The CUDA devices this replica owns, by index (CUDA_VISIBLE_DEVICES); empty on CPU.
    cuda_devices: list[int] = field(default_factory=list)
    version: int = REPLICA_SPEC_VERSION

    def to_json(self) -> str:
        return json.dumps(self.to_wire(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ReplicaSpec:
        return cls.from_wire(json.loads(text))

    @classmethod
    def from_wire(cls, data: Any) -> ReplicaSpec:
        """Version 1 (an agent's spec files from before the rename, which it reads back to adopt
        the replicas still running after a restart) named the model directory `model` and
        carried the CUDA devices in `extra`: read as version 2."""
        check_version(cls, expect_object(cls, data))
        if data.get("version", REPLICA_SPEC_VERSION) < 2:
            old = dict(data)
            old.setdefault("model_dir", old.pop("model", None))
            extra = old.pop("extra", None)
            if isinstance(extra, dict) and "cuda_devices" in extra:
                old.setdefault("cuda_devices", extra["cuda_devices"])
            data = {**old, "version": REPLICA_SPEC_VERSION}
        return from_wire(cls, data)
