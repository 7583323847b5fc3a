"""The replica loop: Redis request stream in, engine steps, token events out.

One thread does everything, in order, so that the engine is never touched concurrently:
read what arrived on the request stream (without blocking while there is work), admit or
abort requests, run one engine step, publish its deltas in one pipeline, heartbeat. When idle
it blocks on the stream for up to 100 ms, so a request is picked up as soon as it arrives.
SIGTERM drains: requests in flight finish, new ones are refused (503) so the gateway can send
them elsewhere.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from dataclasses import dataclass, field

import redis

from workers.engine.errors import RequestError
from workers.engine.sampling_params import SamplingParams
from workers.replica import protocol
from workers.replica.protocol import ReplicaSpec

log = logging.getLogger(__name__)
IDLE_BLOCK_MS = 100
READ_BATCH = 256


@dataclass
class Inflight:
    """What the replica keeps per request besides the engine's sequence."""

    reply_to: str
    arrived: float
    top_logprobs: int | None = None
    first_token_at: float | None = None
    meta: dict = field(default_factory=dict)


class ReplicaServer:
    def __init__(self, spec: ReplicaSpec, engine, client: redis.Redis | None = None):
        self.spec = spec
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.redis = client or redis.Redis.from_url(spec.redis_url, decode_responses=True)
        self.status_key = protocol.status_key(spec.replica_id)
        self.stream = protocol.requests_key(spec.replica_id)
        self.inflight: dict[str, Inflight] = {}
        self.draining = False
        self.last_id = "0-0"
        self._last_beat = 0.0
        self._rate_mark = (time.monotonic(), 0)
        self.tokens_per_second = 0.0
        # Changes with every process start: the gateway notices a replica that restarted under
        # its requests (their streams end with an error rather than wait forever).
        self.incarnation = uuid.uuid4().hex[:12]

    # -- lifecycle ----------------------------------------------------------------------------
    def serve(self) -> None:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        # Start after whatever an earlier incarnation left in the stream: those clients are gone.
        last = self.redis.xrevrange(self.stream, count=1)
        self.last_id = last[0][0] if last else "0-0"
        self._heartbeat("ready", force=True)
        log.info("replica %s ready: %s", self.spec.replica_id, self.spec.model)
        while not (self.draining and not self.inflight):
            busy = self.engine.has_unfinished_requests()
            self._intake(block_ms=None if busy else IDLE_BLOCK_MS)
            if self.engine.has_unfinished_requests():
                self._publish(self.engine.step())
            self._heartbeat("draining" if self.draining else "ready")
        self._heartbeat("stopped", force=True)
        log.info("replica %s drained and stopped", self.spec.replica_id)

    def _on_term(self, signum, frame) -> None:
        if not self.draining:
            log.info("replica %s draining (%d requests in flight)", self.spec.replica_id, len(self.inflight))
        self.draining = True

    # -- intake -------------------------------------------------------------------------------
    def _intake(self, block_ms: int | None) -> None:
        try:
            got = self.redis.xread({self.stream: self.last_id}, count=READ_BATCH, block=block_ms)
        except redis.exceptions.TimeoutError:
            return
        for _stream, entries in got or []:
            for entry_id, fields in entries:
                self.last_id = entry_id
                try:
                    message = protocol.decode(fields["m"])
                except (KeyError, ValueError):
                    log.warning("dropping malformed stream entry %s", entry_id)
                    continue
                if message.get("type") == "abort":
                    self._abort(message.get("id", ""))
                elif message.get("type") == "generate":
                    self._admit(message)

    def _admit(self, message: dict) -> None:
        rid, reply_to = message.get("id"), message.get("reply_to")
        if not rid or not reply_to:
            log.warning("generate message without id or reply_to: %s", list(message))
            return
        if self.draining:
            self._send(reply_to, {"id": rid, "type": "error", "status": 503, "message": "replica is draining"})
            return
        try:
            prompt_ids = self._prompt_ids(message)
            params = dict(message.get("params") or {})
            top = params.get("logprobs")
            seq = self.engine.add_request(rid, prompt_ids, SamplingParams(**params))
        except RequestError as exc:
            code = "context_length_exceeded" if "context" in str(exc) else "invalid_request"
            self._send(reply_to, {"id": rid, "type": "error", "status": 400, "message": str(exc), "code": code})
            return
        except TypeError as exc:  # an unknown sampling field: the gateway should never send one
            self._send(reply_to, {"id": rid, "type": "error", "status": 400, "message": f"bad parameters: {exc}"})
            return
        self.inflight[rid] = Inflight(reply_to, time.monotonic(), top)
        self._send(reply_to, {"id": rid, "type": "accepted", "prompt_tokens": seq.num_prompt_tokens})

    def _prompt_ids(self, message: dict) -> list[int]:
        if message.get("prompt_token_ids") is not None:
            return [int(t) for t in message["prompt_token_ids"]]
        if self.tokenizer is None:
            raise RequestError("this model has no tokenizer; send prompt_token_ids")
        if message.get("messages") is not None:
            return self.tokenizer.apply_chat_template(message["messages"], tools=message.get("tools"))
        return self.tokenizer.encode(message.get("prompt") or "")

    def _abort(self, rid: str) -> None:
        if self.inflight.pop(rid, None) is not None:
            self.engine.abort_request(rid)
            log.info("aborted %s (client went away)", rid)

    # -- output -------------------------------------------------------------------------------
    def _publish(self, deltas) -> None:
        if not deltas:
            return
        now = time.monotonic()
        pipe = self.redis.pipeline(transaction=False)
        for d in deltas:
            req = self.inflight.get(d.request_id)
            if req is None:
                continue
            if req.first_token_at is None:
                req.first_token_at = now
            event = {"id": d.request_id, "type": "delta", "text": d.new_text, "token_ids": d.new_token_ids}
            if d.new_logprobs is not None:
                event["logprobs"] = [
                    self._logprob_entry(t, lp, req.top_logprobs)
                    for t, lp in zip(d.new_token_ids, d.new_logprobs, strict=True)
                ]
            if d.finished:
                self.inflight.pop(d.request_id, None)
                event["finish_reason"] = d.finish_reason
                event["stop_reason"] = d.stop_reason
                event["usage"] = {
                    "prompt_tokens": d.num_prompt_tokens,
                    "completion_tokens": d.num_output_tokens,
                    "cached_tokens": d.num_cached_tokens,
                }
                event["timings"] = {
                    "ttft_ms": round((req.first_token_at - req.arrived) * 1000, 3),
                    "total_ms": round((now - req.arrived) * 1000, 3),
                }
            pipe.publish(req.reply_to, protocol.encode(event))
        pipe.execute()

    def _logprob_entry(self, token_id: int, logprobs: dict[int, float], top: int | None) -> dict:
        ranked = sorted(logprobs.items(), key=lambda kv: kv[1], reverse=True)[: top or 0]
        return {
            "id": token_id,
            "token": self._token_text(token_id),
            "logprob": logprobs[token_id],
            "top": [{"id": t, "token": self._token_text(t), "logprob": lp} for t, lp in ranked],
        }

    def _token_text(self, token_id: int) -> str:
        if self.tokenizer is None:
            return f"<{token_id}>"
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _send(self, channel: str, event: dict) -> None:
        self.redis.publish(channel, protocol.encode(event))

    # -- reporting ----------------------------------------------------------------------------
    def _heartbeat(self, state: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_beat < protocol.HEARTBEAT_INTERVAL:
            return
        self._last_beat = now
        stats = self.engine.stats()
        mark_t, mark_n = self._rate_mark
        if now - mark_t >= 1.0:
            self.tokens_per_second = (stats["generated_tokens"] - mark_n) / (now - mark_t)
            self._rate_mark = (now, stats["generated_tokens"])
        load = {
            "running": stats["running"],
            "waiting": stats["waiting"],
            "kv_blocks_total": stats["kv_blocks_total"],
            "kv_blocks_free": stats["kv_blocks_free"],
            "tokens_per_second": round(self.tokens_per_second, 2),
            "prefix_cache_hits": stats["prefix_cache_hits"],
            "prefix_cache_queries": stats["prefix_cache_queries"],
        }
        endpoint = {"stream": self.stream, "pid": os.getpid(), "max_model_len": self.engine.max_model_len}
        self.redis.hset(
            self.status_key,
            mapping={
                "state": state,
                "load": protocol.encode(load),
                "endpoint": protocol.encode(endpoint),
                "heartbeat": f"{time.time():.3f}",
                "incarnation": self.incarnation,
            },
        )


def report_progress(client: redis.Redis, replica_id: int, stage: str, fraction: float) -> None:
    """While loading: the supervisor mirrors this into the database for the console."""
    client.hset(
        protocol.status_key(replica_id),
        mapping={
            "state": "loading",
            "progress": protocol.encode({"stage": stage, "fraction": round(fraction, 3)}),
            "heartbeat": f"{time.time():.3f}",
        },
    )
