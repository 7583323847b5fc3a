"""What the gateway and a replica say to each other through Redis. Torch-free: the web
process imports it.

- The replica reads its **request stream** `switchyard:replica:<id>:requests` (XADD by the
  gateway): `generate` messages (a prompt, token ids or chat messages, sampling params and the
  pub/sub channel to answer on) and `abort` messages (the client went away). A `generate` may
  ask `return_prompt_token_ids: true` (the gateway keeps them to resume the request elsewhere),
  and a resumed one carries `resume: {"output_tokens": N, "text_sent": M}`: the last N of its
  `prompt_token_ids` are output another replica generated, M characters of whose text the client
  already has.
- It answers each request on the request's **reply channel** (pub/sub), one JSON event per
  message: `accepted` (prompt tokenised, `prompt_tokens`; `prompt_token_ids` when asked;
  `prefill_replica` when the prompt was handed to a prefill replica), `delta` (new text, token ids,
  logprobs; the last one carries `finish_reason`, `usage` and `timings`) or `error` (`status`
  and `message`, e.g. 400 for a prompt over the context).
- It reports itself in the **status hash** `switchyard:replica:<id>:status`: `state`
  (loading → ready → draining → stopped), `progress` while loading, `load` (running/waiting
  requests, KV blocks, tokens/s), `endpoint` and `heartbeat` (unix time). The node agent's
  supervisor mirrors it into the database; the gateway reads `load` and `heartbeat` to route.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

# A replica whose heartbeat is older than this is not sent new requests, and the streams of
# its requests in flight end with an error.
HEARTBEAT_INTERVAL = 0.5
HEARTBEAT_STALE_SECONDS = 3.0
REQUEST_STREAM_MAXLEN = 10_000


def status_key(replica_id: int) -> str:
    return f"switchyard:replica:{replica_id}:status"


def requests_key(replica_id: int) -> str:
    return f"switchyard:replica:{replica_id}:requests"


def encode(message: dict) -> str:
    return json.dumps(message, separators=(",", ":"))


def decode(raw: str | bytes) -> dict:
    return json.loads(raw)


def is_fresh(status: dict, now: float | None = None) -> bool:
    """True when the status hash carries a recent heartbeat."""
    try:
        beat = float(status.get("heartbeat", 0))
    except (TypeError, ValueError):
        return False
    return (now or time.time()) - beat < HEARTBEAT_STALE_SECONDS


@dataclass
class ReplicaSpec:
    """Everything a replica process needs to start, written by the supervisor as JSON next to
    its log (the replica never reads the database)."""

    replica_id: int
    deployment: str
    model: str  # model directory
    model_name: str
    role: str = "colocated"
    device: str = "cpu"
    dtype: str = "auto"
    block_size: int = 16
    enable_prefix_caching: bool = True
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048  # per-step token budget: the prefill chunk size
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
    extra: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> ReplicaSpec:
        raw = json.loads(text)
        known = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        return cls(**known)
