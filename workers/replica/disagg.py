"""The prefill and decode roles of disaggregated serving, inside the replica loop.

Decode replica (it owns the client's stream):
  1. a `generate` naming a prefill replica arrives; it tokenises, checks the context, reserves
     KV blocks and answers `accepted`;
  2. it sends the prefill replica a `prefill` message: token ids, sampling params, its
     Mooncake endpoint and KV layout, the reserved block ids and a deadline (now + timeout);
  3. on `prefilled` (first token, its logprobs, cached tokens) it admits the sequence into its
     running batch; on `prefill_failed`, or when the deadline passes, it prefills the request
     itself (a *fallback*, counted and recorded on the request).
  Blocks of a request that timed out stay quarantined until the prefill side's late answer or
  the deadline plus a grace period, so a late write can never land in reused memory.

Prefill replica: checks the layout (a mismatch is refused with the reason), computes the
prompt (its own prefix cache applies) with max_tokens=1 holding the blocks, and starts writing
them into the decode replica's reserved blocks with Mooncake. It goes on computing other prompts
while the write is in flight, polls it each loop pass, and sends `prefilled` (or
`prefill_failed`) once the write has ended, never before: the decode side reuses the blocks
when it hears back. It starts no transfer after the deadline, and keeps its own blocks until the
write has ended, even past the deadline.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, replace

from workers.engine.errors import RequestError
from workers.engine.sampling_params import SamplingParams
from workers.kvtransfer import KVTransferError, layout_mismatch
from workers.kvtransfer.layout import ranks_mismatch
from workers.kvtransfer.mooncake import Transfer
from workers.protocol import replica as protocol
from workers.protocol.replica import (
    DEFAULT_SHARE,
    HANDOFF_MESSAGES,
    PrefilledMessage,
    PrefillFailedMessage,
    PrefillMessage,
    Share,
    WireSamplingParams,
)
from workers.protocol.wire import ProtocolError

log = logging.getLogger(__name__)
QUARANTINE_GRACE_SECONDS = 5.0


@dataclass
class Handoff:
    """A request the decode replica waits on a prefill replica for."""

    prompt_ids: list[int]
    params: WireSamplingParams
    blocks: list[int]
    deadline: float
    prefill_replica: int
    session_turn: bool = False
    share: Share = DEFAULT_SHARE
    aborted: bool = False


@dataclass
class PrefillJob:
    """A prompt the prefill replica computes for a decode replica."""

    remote: dict
    blocks: list[int]
    reply_stream: str
    deadline: float
    num_prompt_tokens: int


@dataclass
class Sending:
    """A prefilled prompt whose blocks are on their way to the decode replica."""

    job: PrefillJob
    transfer: Transfer
    first_token: int
    logprobs: dict | None
    cached_tokens: int


@dataclass
class KVStats:
    handoffs: int = 0
    fallbacks: int = 0
    bytes_sent: int = 0
    blocks_sent: int = 0
    bytes_received: int = 0
    blocks_received: int = 0
    transfer_seconds: float = 0.0
    fallback_reasons: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {**asdict(self), "transfer_seconds": round(self.transfer_seconds, 4)}


class Disaggregation:
    """Both roles' bookkeeping; the server calls in from its loop (one thread)."""

    def __init__(self, server, kv, timeout: float):
        self.server = server
        self.engine = server.engine
        self.kv = kv  # MooncakeKV, or GroupKV for a parallel replica (kvtransfer/ranks.py)
        self.timeout = timeout
        self.layout = {**self.engine.kv_layout(), "model": server.spec.model_name}
        self.waiting: dict[str, Handoff] = {}  # decode side
        self.quarantine: list[tuple[float, str, list[int]]] = []  # (until, request id, blocks)
        self.jobs: dict[str, PrefillJob] = {}  # prefill side: prompts being computed
        self.sending: dict[str, Sending] = {}  # prefill side: blocks being written
        self.stats = KVStats()

    def endpoint(self) -> dict:
        return {**self.kv.endpoint(), "layout": self.layout}

    def handle(self, data: dict) -> None:
        """A message between replicas, off the request stream."""
        kind = data.get("type")
        cls = HANDOFF_MESSAGES.get(kind) if isinstance(kind, str) else None
        if cls is None:
            return
        try:
            message = cls.from_wire(data)
        except ProtocolError as exc:
            log.warning("dropping a %s message: %s", kind, exc)
            reply = data.get("reply_stream")
            if cls is PrefillMessage and isinstance(reply, str):  # the decode side need not wait out its deadline
                self._send(reply, PrefillFailedMessage(str(data.get("id", "")), f"cannot prefill: {exc}"))
            return
        if isinstance(message, PrefillMessage):
            self.on_prefill(message)
        elif isinstance(message, PrefilledMessage):
            self.on_prefilled(message)
        else:
            self.on_prefill_failed(message)

    # -- decode side --------------------------------------------------------------------------
    def start_handoff(self, rid: str, prompt_ids: list[int], params: WireSamplingParams, prefill_replica: int,
                      session_turn: bool = False, share: Share = DEFAULT_SHARE) -> bool:  # fmt: skip
        """Reserve blocks and ask the prefill replica; False if this replica must prefill itself.
        `params` were checked by the caller (ReplicaServer._admit builds SamplingParams first);
        `session_turn` goes with the prompt to whichever replica computes it (its KV tiers share it),
        and so does `share` (its priority and tenant: both engines queue it by them)."""
        self.engine.check_prompt(prompt_ids)  # a bad prompt fails here, before anything is reserved
        blocks = self.engine.reserve_blocks(len(prompt_ids))
        if blocks is None:
            self._count_fallback("no free KV blocks to reserve")
            return False
        deadline = time.time() + self.timeout
        self.waiting[rid] = Handoff(prompt_ids, params, blocks, deadline, prefill_replica, session_turn, share)
        message = PrefillMessage(
            rid, prompt_ids, params, self.endpoint(), blocks, self.server.stream, deadline, session_turn, share
        )
        self._send(protocol.requests_key(prefill_replica), message)
        return True

    def on_prefilled(self, message: PrefilledMessage) -> None:
        rid = message.id
        handoff = self.waiting.pop(rid, None)
        if handoff is None:  # we gave up on it already: the write is over, free the blocks
            self._unquarantine(rid)
            return
        if handoff.aborted:
            self.engine.release_blocks(handoff.blocks)
            return
        logprobs = {int(k): v for k, v in message.logprobs.items()} if message.logprobs else None
        self.stats.handoffs += 1
        self.stats.blocks_received += len(handoff.blocks)
        self.stats.bytes_received += int(message.bytes)
        delta = self.engine.add_prefilled_request(
            rid,
            handoff.prompt_ids,
            SamplingParams.from_wire(handoff.params),
            handoff.blocks,
            int(message.first_token),
            logprobs,
            int(message.cached_tokens),
            session_turn=handoff.session_turn,
            share=handoff.share,
        )
        req = self.server.inflight.get(rid)
        if req is not None:
            req.meta["prefill"] = {"replica": handoff.prefill_replica, "transfer_ms": message.transfer_ms}
        self.server.collect([delta])

    def on_prefill_failed(self, message: PrefillFailedMessage) -> None:
        rid = message.id
        handoff = self.waiting.pop(rid, None)
        if handoff is None:
            self._unquarantine(rid)
            return
        self.engine.release_blocks(handoff.blocks)  # the prefill side wrote nothing
        if not handoff.aborted:
            self._fallback(rid, handoff, message.reason)

    def abort(self, rid: str) -> bool:
        handoff = self.waiting.get(rid)
        if handoff is None:
            return False
        handoff.aborted = True  # its blocks are freed when the prefill side answers, or later
        return True

    def tick(self) -> None:
        """Each loop pass: answer for writes that have ended; give up on handoffs past their
        deadline; end quarantines."""
        for rid, sending in list(self.sending.items()):
            self._poll_write(rid, sending)
        now = time.time()
        for rid, handoff in list(self.waiting.items()):
            if now >= handoff.deadline:
                del self.waiting[rid]
                self.quarantine.append((handoff.deadline + QUARANTINE_GRACE_SECONDS, rid, handoff.blocks))
                if not handoff.aborted:
                    why = f"no KV from prefill replica {handoff.prefill_replica} in {self.timeout:g}s"
                    self._fallback(rid, handoff, why)
        if self.quarantine and self.quarantine[0][0] <= now:
            keep = []
            for until, rid, blocks in self.quarantine:
                if until <= now:
                    self.engine.release_blocks(blocks)
                else:
                    keep.append((until, rid, blocks))
            self.quarantine = keep

    def _unquarantine(self, rid: str) -> None:
        for i, (_, qrid, blocks) in enumerate(self.quarantine):
            if qrid == rid:
                self.engine.release_blocks(blocks)
                del self.quarantine[i]
                return

    def _fallback(self, rid: str, handoff: Handoff, reason: str) -> None:
        log.warning("request %s: %s; prefilling here", rid, reason)
        self._count_fallback(reason)
        req = self.server.inflight.get(rid)
        if req is not None:
            req.meta["fallback"] = reason
        try:
            params = SamplingParams.from_wire(handoff.params)
            self.engine.add_request(
                rid, handoff.prompt_ids, params, session_turn=handoff.session_turn, share=handoff.share
            )
        except RequestError as exc:  # cannot happen for a request that was accepted; be safe
            self.server.fail(rid, str(exc))

    def _count_fallback(self, reason: str) -> None:
        self.stats.fallbacks += 1
        key = reason.split(" in ")[0][:60]
        self.stats.fallback_reasons[key] = self.stats.fallback_reasons.get(key, 0) + 1

    # -- prefill side -------------------------------------------------------------------------
    def on_prefill(self, message: PrefillMessage) -> None:
        rid, reply = message.id, message.reply_stream
        remote = message.kv if isinstance(message.kv, dict) else {}
        problem = layout_mismatch(self.layout, remote.get("layout") or {}) or ranks_mismatch(self.endpoint(), remote)
        if problem is None and time.time() >= float(message.deadline):
            problem = "the deadline passed before the prefill started"
        if problem is None:
            try:
                # Sample 0's first token (n > 1: the decode replica forks the others from our KV).
                params = SamplingParams.from_wire(replace(message.params, max_tokens=1, n=1))
                prompt = [int(t) for t in message.prompt_token_ids]
                self.engine.add_request(
                    rid,
                    prompt,
                    params,
                    hold_blocks=True,
                    session_turn=message.session_turn is True,
                    share=message.share if isinstance(message.share, Share) else DEFAULT_SHARE,
                )
            except (RequestError, KeyError, TypeError, ValueError) as exc:
                problem = f"cannot prefill: {exc}"
        if problem is not None:
            log.warning("refusing prefill %s: %s", rid, problem)
            self._send(reply, PrefillFailedMessage(rid, problem))
            return
        self.jobs[rid] = PrefillJob(remote, list(message.blocks), reply, float(message.deadline), len(prompt))

    def on_prefill_delta(self, delta) -> bool:
        """A step's delta for one of our prefill jobs: start writing its blocks."""
        job = self.jobs.pop(delta.request_id, None)
        if job is None:
            return False
        rid = delta.request_id
        if delta.error is not None:  # the engine failed this request alone (LLMEngine._fail)
            self._send(job.reply_stream, PrefillFailedMessage(rid, f"the prefill failed: {delta.error}"))
            return True
        try:
            if time.time() >= job.deadline:
                raise KVTransferError("the deadline passed before the transfer started")
            local = self.engine.held[rid].block_table[: len(job.blocks)]
            transfer = self.kv.start_write(job.remote, local, job.blocks)
        except (KVTransferError, KeyError) as exc:
            self.engine.release_held(rid)
            self._send(job.reply_stream, PrefillFailedMessage(rid, str(exc)))
            return True
        lp = delta.new_logprobs[0] if delta.new_logprobs else None
        sending = Sending(job, transfer, delta.new_token_ids[0], lp, delta.num_cached_tokens)
        self.sending[rid] = sending
        self._poll_write(rid, sending)  # a write that could not start ends here
        return True

    def _poll_write(self, rid: str, sending: Sending) -> None:
        """Once the write has ended: free our blocks and answer the decode replica."""
        transfer = sending.transfer
        try:
            if not transfer.poll():
                return
        except KVTransferError as exc:
            del self.sending[rid]
            self.engine.release_held(rid)
            self._send(sending.job.reply_stream, PrefillFailedMessage(rid, str(exc)))
            return
        del self.sending[rid]
        self.engine.release_held(rid)
        self.stats.handoffs += 1
        self.stats.bytes_sent += transfer.nbytes
        self.stats.blocks_sent += transfer.nblocks
        self.stats.transfer_seconds += transfer.seconds
        lp = sending.logprobs
        self._send(
            sending.job.reply_stream,
            PrefilledMessage(
                rid,
                sending.first_token,
                logprobs={str(k): v for k, v in lp.items()} if lp else None,
                cached_tokens=sending.cached_tokens,
                bytes=transfer.nbytes,
                transfer_ms=round(transfer.seconds * 1000, 3),
            ),
        )

    def prefill_tokens_inflight(self) -> int:
        return sum(job.num_prompt_tokens for job in self.jobs.values())

    def _send(self, stream: str | None, message: PrefillMessage | PrefilledMessage | PrefillFailedMessage) -> None:
        """Onto another replica's request stream (the prefill side's, or the decode side's reply)."""
        if stream:
            self.server.redis.xadd(
                stream,
                {"m": protocol.encode(message.to_wire())},
                maxlen=protocol.REQUEST_STREAM_MAXLEN,
                approximate=True,
            )
