"""The replica loop: Redis request stream in, engine steps, token events out.

Only the main thread touches the engine: it admits or aborts what arrived, runs one engine
step, publishes the step's events in one write (in order, so a request's `accepted` always
precedes its deltas) whose replies it reads a step later, heartbeats. The intake thread blocks
on the request stream and queues what it reads, so no Redis round trip waits in that loop.
(Publishing from a second thread was measured slower: on a busy machine the hand-over cost
more than the round trip it saved.)
SIGTERM drains: requests in flight finish, new ones are refused (503) so the gateway can send
them elsewhere.
The same write carries the step's changes to the replica's KV index, the Redis set of the block
hashes its prefix cache holds (workers/protocol/kv_blocks.py), so routers see them a step later.
Every role keeps one (a prefill replica's cache is as real as a colocated one's).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field

import redis

from workers.engine.errors import RequestError
from workers.engine.sampling_params import SamplingParams
from workers.protocol import replica as protocol
from workers.protocol.kv_blocks import kv_index_key, kv_members
from workers.protocol.replica import (
    AbortMessage,
    AcceptedEvent,
    DeltaEvent,
    ErrorEvent,
    Event,
    GenerateMessage,
    MessageError,
    ReplicaSpec,
    ReplicaStatus,
    Resume,
)
from workers.protocol.wire import ProtocolError
from workers.replica.metrics import ReplicaMetrics, speculative_metrics, tier_metrics

log = logging.getLogger(__name__)
IDLE_WAIT_SECONDS = 0.1
TRANSFER_POLL_SECONDS = 0.001
READ_BLOCK_MS = 1000
READ_BATCH = 256
# Redis unreachable: the intake retries after this, doubling up to the maximum.
REDIS_RETRY_SECONDS = 0.2
REDIS_RETRY_MAX_SECONDS = 2.0


@dataclass
class Inflight:
    """What the replica keeps per request besides the engine's sequence."""

    reply_to: str
    arrived: float
    top_logprobs: int | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    meta: dict = field(default_factory=dict)
    samples_left: int = 1  # `n`: the request is done when every sample has finished
    grammar_ms: float | None = None  # compiling its grammar at admission (None: it has none)


class ReplicaServer:
    def __init__(self, spec: ReplicaSpec, engine, client: redis.Redis | None = None):
        self.spec = spec
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.redis = client or redis.Redis.from_url(spec.redis_url, decode_responses=True)
        # The intake thread's own connection: its blocking XREAD must not hold up a publish.
        self._intake_redis = redis.Redis.from_url(spec.redis_url, decode_responses=True)
        self.incoming: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: list[tuple[str, Event]] = []  # events of this loop pass, sent as one batch
        self._publish_conn = redis.Redis.from_url(spec.redis_url).connection_pool.get_connection()
        self._unread_replies = 0
        self._stopping = threading.Event()
        self.intake_error: BaseException | None = None
        self.redis_lost_at: float | None = None  # monotonic time Redis was found unreachable
        self.disagg = None  # a disagg.Disaggregation for the prefill and decode roles
        self.metrics = ReplicaMetrics()
        # Measured once after load (on a parallel group, one collective over the ranks).
        self.rank_memory = engine.rank_memory() if hasattr(engine, "rank_memory") else []
        self.status_key = protocol.status_key(spec.replica_id)
        self.stream = protocol.requests_key(spec.replica_id)
        self.kv_key = kv_index_key(spec.replica_id)
        self._kv_resync = False  # the KV index is to be written whole (Redis was unreachable)
        self.inflight: dict[str, Inflight] = {}
        self.draining = False
        self.last_id = "0-0"
        self._last_beat = 0.0
        self._serving_beats = 0  # status writes since serve() began
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
        # What an earlier incarnation published went with its memory. The engine's pending KV
        # events hold all it has cached so far, so the first flush fills the set from here.
        self.redis.delete(self.kv_key)
        self._start_intake()
        self._heartbeat("ready", force=True)
        log.info("replica %s ready: %s", self.spec.replica_id, self.spec.model_dir)
        while not (self.draining and not self.inflight and not self._writing()):
            if self.intake_error is not None:  # a bug, not Redis: exit, the supervisor restarts us
                raise RuntimeError("the intake thread failed") from self.intake_error
            if self.engine.has_unfinished_requests():
                self._take_incoming(wait=0)
            else:  # idle; a KV write in flight is polled every millisecond
                self._take_incoming(wait=TRANSFER_POLL_SECONDS if self._writing() else IDLE_WAIT_SECONDS)
            if self.disagg is not None:
                self.disagg.tick()
            if self.engine.has_unfinished_requests():
                self.collect(self.engine.step())
            self._flush()
            self._heartbeat("draining" if self.draining else "ready")
        self._stopping.set()
        self._drop_kv_index()
        # Logged before the last heartbeat: once "stopped" is visible (and the control plane
        # records it), the log already says so (a fresh-clone run read the log in between).
        log.info("replica %s drained and stopped", self.spec.replica_id)
        self._heartbeat("stopped", force=True)

    def _on_term(self, signum, frame) -> None:
        if not self.draining:
            log.info("replica %s draining (%d requests in flight)", self.spec.replica_id, len(self.inflight))
        self.draining = True

    # -- intake -------------------------------------------------------------------------------
    def _start_intake(self) -> threading.Thread:
        thread = threading.Thread(target=self._intake_loop, name="intake", daemon=True)
        thread.start()
        return thread

    def _intake_loop(self) -> None:
        """Read the request stream for as long as the replica runs. Redis going away is waited
        out (with backoff): the replica keeps its loaded model and reads on where it stopped
        when Redis returns. Any other failure is a bug: surfaced to the main loop, which exits."""
        backoff = REDIS_RETRY_SECONDS
        while not self._stopping.is_set():
            try:
                self._read_stream()
                return
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                log.warning("request stream unreachable (%s); retrying in %.1fs", exc, backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, REDIS_RETRY_MAX_SECONDS)
            except Exception as exc:
                log.exception("intake thread failed")
                self.intake_error = exc
                return

    def _read_stream(self) -> None:
        """Block on the stream; queue each decoded message for the main loop."""
        while not self._stopping.is_set():
            got = self._intake_redis.xread({self.stream: self.last_id}, count=READ_BATCH, block=READ_BLOCK_MS)
            if self.redis_lost_at is not None:
                log.info("Redis is back after %.1fs", time.monotonic() - self.redis_lost_at)
                self.redis_lost_at = None
            for _stream, entries in got or []:
                for entry_id, fields in entries:
                    self.last_id = entry_id
                    try:
                        message = protocol.decode(fields["m"])
                    except (KeyError, ValueError):
                        message = None
                    if isinstance(message, dict):  # each kind is read (from_wire) where it is handled
                        self._compile_grammar(message)
                        self.incoming.put(message)
                    else:
                        log.warning("dropping malformed stream entry %s", entry_id)

    def _compile_grammar(self, message: dict) -> None:
        """Compile a request's grammar here, on the intake thread, so that the main loop finds it
        compiled. The first grammar imports xgrammar (a second of CPU, several on a loaded
        machine) and a large schema can take as long: done on the loop, that pass left the
        heartbeat late enough for the gateway to take the replica for dead and end its streams.
        A grammar that does not compile is left to the loop, which answers it with its 400."""
        grammars = getattr(self.engine, "grammars", None)  # a simulated engine has none
        params = message.get("params")
        spec = params.get("grammar") if isinstance(params, dict) else None
        if grammars is None or message.get("type") != "generate" or not isinstance(spec, dict):
            return
        with contextlib.suppress(Exception):  # compiled again on the loop, which reports the problem
            grammars.compile(spec)

    def _writing(self) -> bool:
        """A prefill replica with KV writes in flight: it must not exit or sleep long."""
        return self.disagg is not None and bool(self.disagg.sending)

    def _take_incoming(self, wait: float) -> None:
        """Admit or abort everything queued; wait up to `wait` seconds for the first message."""
        try:
            message = self.incoming.get(timeout=wait) if wait else self.incoming.get_nowait()
        except queue.Empty:
            return
        while True:
            kind = message.get("type")
            if kind == AbortMessage.TYPE:
                try:
                    self._abort(AbortMessage.from_wire(message).id)
                except ProtocolError as exc:
                    log.warning("dropping an abort message: %s", exc)
            elif kind == GenerateMessage.TYPE:
                self._admit(message)
            elif self.disagg is not None:
                self.disagg.handle(message)
            try:
                message = self.incoming.get_nowait()
            except queue.Empty:
                return

    def _admit(self, data: dict) -> None:
        """Admit one `generate` message, or answer it with an error event. Whatever is wrong
        with it ends there: the loop and the other requests go on."""
        rid, reply_to = data.get("id"), data.get("reply_to")  # whom to answer, even if the rest is unreadable
        if not (rid and reply_to and isinstance(rid, str) and isinstance(reply_to, str)):
            log.warning("generate message without id or reply_to: %s", list(data))
            return
        if rid in self.inflight:  # sent twice (a gateway retried a send whose connection dropped)
            log.warning("generate %s is already running here: the duplicate is dropped", rid)
            return
        if self.draining:
            self._send(reply_to, ErrorEvent(rid, 503, "replica is draining"))
            return
        chat = data.get("messages") is not None
        try:
            message = GenerateMessage.from_wire(data)
            params = SamplingParams.from_wire(message.params)
            prompt_ids = self._prompt_ids(message)
            output_ids, text_sent = _resumed(message.resume, prompt_ids)
            prompt_ids = prompt_ids[: len(prompt_ids) - len(output_ids)]
            prefill = message.prefill_replica
            if len(prompt_ids) < self.spec.local_prefill_tokens or output_ids:
                prefill = None  # a prefill replica would not know the output's part (seed positions, penalties)
            turn, share = message.session_turn, message.share
            compiling = time.monotonic()
            self.engine.check_grammar(params)  # a grammar that cannot compile: 400 before any handoff
            grammar_ms = round((time.monotonic() - compiling) * 1000, 3) if params.grammar is not None else None
            if not (
                self.disagg
                and prefill is not None
                and self.disagg.start_handoff(rid, prompt_ids, message.params, prefill, turn, share)
            ):
                self.engine.add_request(rid, prompt_ids, params, output_token_ids=output_ids,
                                        emitted_text_len=text_sent, session_turn=turn, share=share)  # fmt: skip
        except (RequestError, MessageError) as exc:
            # The engine names prompt problems `prompt`; a chat request sent `messages`.
            param = "messages" if exc.param == "prompt" and chat else exc.param
            code = "context_length_exceeded" if exc.param == "prompt" and "context" in str(exc) else "invalid_value"
            self._send(reply_to, ErrorEvent(rid, 400, str(exc), param, code))
            return
        except ProtocolError as exc:  # a newer gateway's message: what it asks may not be what this replica reads
            log.warning("request %s refused: %s", rid, exc)
            self._send(reply_to, ErrorEvent(rid, 500, str(exc), code="unsupported_version"))
            return
        except (TypeError, ValueError, OverflowError, AttributeError) as exc:
            # Malformed beyond what the gateway lets through (chat messages the template cannot
            # render...): the details go to the log, the client gets which part to fix.
            log.warning("request %s refused: %s: %s", rid, type(exc).__name__, exc)
            param = "messages" if chat else "prompt"
            self._send(
                reply_to, ErrorEvent(rid, 400, f"the request's {param} could not be read", param, "invalid_value")
            )
            return
        except Exception:  # a bug met by this request alone must not end every other one
            log.exception("admitting request %s failed", rid)
            self._send(reply_to, ErrorEvent(rid, 500, "the replica could not admit the request", code="replica_error"))
            return
        self.inflight[rid] = Inflight(
            reply_to, time.monotonic(), params.logprobs, samples_left=params.n, grammar_ms=grammar_ms
        )
        handoff = self.disagg.waiting.get(rid) if self.disagg is not None else None
        self._send(
            reply_to,
            AcceptedEvent(
                rid,
                len(prompt_ids),
                # the gateway keeps them to resume the request elsewhere
                prompt_token_ids=prompt_ids if message.return_prompt_token_ids else None,
                # a prefill replica computes the prompt (unless it falls back later)
                prefill_replica=handoff.prefill_replica if handoff is not None else None,
            ),
        )

    def _prompt_ids(self, message: GenerateMessage) -> list[int]:
        if message.prompt_token_ids is not None:
            return message.prompt_token_ids
        if self.tokenizer is None:
            raise RequestError("this model has no tokenizer; send prompt_token_ids")
        # A gateway that could read the model sends ids, tokenised by this same function.
        return self.tokenizer.prompt_ids(message.messages, message.tools, message.prompt)

    def _abort(self, rid: str) -> None:
        if self.inflight.pop(rid, None) is not None:
            if not (self.disagg is not None and self.disagg.abort(rid)):
                self.engine.abort_request(rid)
            self.metrics.requests_aborted += 1
            log.info("aborted %s (client went away)", rid)

    def fail(self, rid: str, message: str) -> None:
        """End one request with an error event (the others carry on)."""
        req = self.inflight.pop(rid, None)
        if req is not None:
            self._send(req.reply_to, ErrorEvent(rid, 500, message))

    # -- output -------------------------------------------------------------------------------
    def collect(self, deltas) -> None:
        """Turn deltas into events, published at the end of this loop pass."""
        now, wall = time.monotonic(), round(time.time(), 6)
        for d in deltas:
            if self.disagg is not None and self.disagg.on_prefill_delta(d):
                continue  # a prompt computed for a decode replica: its blocks went there
            req = self.inflight.get(d.request_id)
            if req is None:
                continue
            if d.finish_reason == "error":
                self._engine_failed(d.request_id, req, d.error)
                continue
            self.metrics.token(req.arrived, req.last_token_at, now, len(d.new_token_ids))
            event = DeltaEvent(d.request_id, d.new_text, d.new_token_ids, wall, index=d.index)
            if req.first_token_at is None:
                req.first_token_at = now
                event.timings = self._phases_so_far(req, d.scheduled_at)
                event.disaggregation = dict(req.meta) if req.meta else None
            req.last_token_at = now
            if d.new_logprobs is not None:
                event.logprobs = [
                    self._logprob_entry(t, lp, req.top_logprobs)
                    for t, lp in zip(d.new_token_ids, d.new_logprobs, strict=True)
                ]
            if d.finished:
                req.samples_left -= 1
                if not req.samples_left:
                    self.inflight.pop(d.request_id, None)
                    self.metrics.finished(d.num_prompt_tokens, d.num_cached_tokens)
                    scheduled = _scheduled(req, d.scheduled_at)
                    phases = (scheduled - req.arrived, req.first_token_at - scheduled, now - req.first_token_at)
                    self.metrics.phases(*phases)
                event.finish_reason = d.finish_reason
                event.stop_reason = d.stop_reason
                event.usage = {
                    "prompt_tokens": d.num_prompt_tokens,
                    "completion_tokens": d.num_output_tokens,
                    "cached_tokens": d.num_cached_tokens,
                }
                event.timings = {  # over the phases so far, when this is also the sample's first delta
                    **(event.timings or {}),
                    "ttft_ms": round((req.first_token_at - req.arrived) * 1000, 3),
                    "total_ms": round((now - req.arrived) * 1000, 3),
                }
                if not req.samples_left:
                    event.timings.update(self._phases_so_far(req, d.scheduled_at), decode_ms=round(phases[2] * 1000, 3))
                if req.meta:
                    event.disaggregation = req.meta
            self._pending.append((req.reply_to, event))

    @staticmethod
    def _phases_so_far(req: Inflight, scheduled_at: float | None) -> dict:
        """Its queue and prefill (and grammar) times, sent with its first token: should the
        request move to another replica later, its trace still shows them."""
        scheduled = _scheduled(req, scheduled_at)
        timings = {
            "queue_ms": round((scheduled - req.arrived) * 1000, 3),
            "prefill_ms": round((req.first_token_at - scheduled) * 1000, 3),
        }
        if req.grammar_ms is not None:
            timings["grammar_ms"] = req.grammar_ms
        return timings

    def _engine_failed(self, rid: str, req: Inflight, cause: str | None) -> None:
        """The engine failed while stepping `rid` and ended it (every sample; the traceback is in
        its log): the request ends with one error event, the others carry on. Its other samples'
        error deltas find it gone and are dropped."""
        self.inflight.pop(rid, None)
        self.engine.abort_request(rid)  # a no-op when the engine ended every sample, as it does
        self.metrics.requests_errored += 1
        cause = cause or "an unknown error"
        log.error(
            "request %s failed in the engine: %s; the other %d request(s) carry on", rid, cause, len(self.inflight)
        )
        message = f"the engine failed on request {rid}: {cause}; other requests were not affected"
        self._send(req.reply_to, ErrorEvent(rid, 500, message, code=protocol.ENGINE_ERROR))

    def _flush(self) -> None:
        """Send this pass's events in one write, without waiting for Redis' replies: they are
        read at the next flush, by when they have long arrived, so no round trip sits between
        two engine steps."""
        conn = self._publish_conn
        try:
            self._read_replies()
            commands = [("PUBLISH", channel, protocol.encode(event.to_wire())) for channel, event in self._pending]
            commands += self._kv_commands()
            if commands:
                conn.send_packed_command(conn.pack_commands(commands))
                self._unread_replies = len(commands)
                self._pending = []
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            self._on_redis_lost(exc)

    def _read_replies(self) -> None:
        """Read the replies to the last flush's write."""
        for _ in range(self._unread_replies):
            try:
                self._publish_conn.read_response()
            except redis.ResponseError as exc:  # one command refused (a foreign value at our key?): the rest stand
                log.warning("Redis refused a write: %s", exc)
        self._unread_replies = 0

    def _kv_commands(self) -> list[tuple]:
        """The writes that bring the KV index up to date: the engine's changes since the last
        flush or, after Redis was unreachable, the whole index (deltas sent meanwhile may be
        lost, and a restarted Redis may hold none of it)."""
        key = self.kv_key
        if self._kv_resync:
            if self.redis_lost_at is not None:
                return []  # not back yet (the intake notices); the engine keeps the changes
            self._kv_resync = False
            members = kv_members(self.engine.take_kv_snapshot())
            if not members:
                return [("DEL", key)]
            # In one transaction, so that no router reads the set emptied halfway.
            return [("MULTI",), ("DEL", key), ("SADD", key, *members), ("EXEC",)]
        stored, removed = self.engine.take_kv_events()
        commands: list[tuple] = []
        if removed:
            commands.append(("SREM", key, *kv_members(removed)))
        if stored:
            commands.append(("SADD", key, *kv_members(stored)))
        return commands

    def _drop_kv_index(self) -> None:
        """Stopping: this incarnation's cache goes with it. Sent on the connection that filled
        the set, after its last writes, so that none of them lands after the DEL."""
        try:
            self._read_replies()
            self._publish_conn.send_command("DEL", self.kv_key)
            self._publish_conn.read_response()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            log.warning("could not drop the KV index %s (%s); the node agent drops it", self.kv_key, exc)

    def _on_redis_lost(self, exc: Exception) -> None:
        """Redis went away: what was published since is lost, so the requests in flight cannot
        be answered coherently any more (their gateways have ended them with an error). Abort
        them, free their KV, and carry on: the next publish reconnects. The KV index is
        written whole once Redis is back."""
        if self.redis_lost_at is None:
            self.redis_lost_at = time.monotonic()
            log.warning("Redis unreachable (%s): aborting %d request(s) in flight", exc, len(self.inflight))
        self._publish_conn.disconnect()
        self._unread_replies = 0
        self._pending = []
        self._kv_resync = True
        for rid in list(self.inflight):
            self._abort(rid)

    def _logprob_entry(self, token_id: int, logprobs: dict[int, float], top: int | None) -> protocol.TokenLogprob:
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

    def _send(self, channel: str, event: Event) -> None:
        self._pending.append((channel, event))

    # -- reporting ----------------------------------------------------------------------------
    def _heartbeat(self, state: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_beat < protocol.HEARTBEAT_INTERVAL:
            return
        if self._last_beat and now - self._last_beat > protocol.HEARTBEAT_STALE_SECONDS / 2:
            log.warning("heartbeat %.1fs late: one loop pass took too long", now - self._last_beat)
        self._last_beat = now
        self.engine.check_health()  # a parallel group's dead rank ends this process: restarted whole
        stats = self.engine.stats()
        mark_t, mark_n = self._rate_mark
        if now - mark_t >= 1.0:
            self.tokens_per_second = (stats["generated_tokens"] - mark_n) / (now - mark_t)
            self._rate_mark = (now, stats["generated_tokens"])
        load: protocol.ReplicaLoad = {
            "role": self.spec.role,
            "running": stats["running"],
            "waiting": stats["waiting"],
            "kv_blocks_total": stats["kv_blocks_total"],
            "kv_blocks_free": stats["kv_blocks_free"],
            "tokens_per_second": round(self.tokens_per_second, 2),
            "prefix_cache_hits": stats["prefix_cache_hits"],
            "prefix_cache_queries": stats["prefix_cache_queries"],
            "preemptions": stats["preemptions"],
        }
        if self.rank_memory:
            load["rank_memory"] = self.rank_memory
        tiers = tier_metrics(self.engine.tier_stats())
        if tiers is not None:
            load["kv_tiers"] = tiers
        endpoint: protocol.Endpoint = {
            "stream": self.stream,
            "pid": os.getpid(),
            "max_model_len": self.engine.max_model_len,
        }
        if self.disagg is not None:
            load["prefill_tokens_inflight"] = self.disagg.prefill_tokens_inflight()
            load["kv_writes_inflight"] = len(self.disagg.sending)
            load["handoffs_waiting"] = len(self.disagg.waiting)
            load["kv_transfer"] = self.disagg.stats.as_dict()
            endpoint["kv_session"] = self.disagg.kv.session
        metrics = {"deployment": self.spec.deployment, "role": self.spec.role, **self.metrics.as_dict()}
        if stats.get("tenants"):
            metrics["tenants"] = stats["tenants"]
        if self.spec.speculative is not None:
            spec = speculative_metrics(self.spec.speculative.method, self.engine.speculation_stats())
            if spec is not None:
                metrics["speculative"] = spec
        status = ReplicaStatus(
            state,
            time.time(),
            self.incarnation,
            load=load,
            endpoint=endpoint,
            metrics=metrics,
            kv_block_size=self.engine.config.block_size,
        )
        try:
            added = self.redis.hset(self.status_key, mapping=status.to_hash())
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            self._on_redis_lost(exc)
            return
        # Every serving beat writes the same fields: new ones after the first mean the hash was
        # gone, so Redis restarted empty between two beats (its client reconnects silently) and
        # took the KV index with it.
        if added and self._serving_beats:
            log.warning("the status hash had vanished (Redis restarted?): rewriting the KV index")
            self._kv_resync = True
        self._serving_beats += 1


def _resumed(resume: Resume | None, prompt_ids: list[int]) -> tuple[list[int], int]:
    """The output part of a resumed request's prompt ids, and how much of its text the client
    has (None: a new request)."""
    if resume is None:
        return [], 0
    count = resume.output_tokens
    if count >= len(prompt_ids):
        raise RequestError("resume.output_tokens must leave a prompt before the output", "resume")
    return (prompt_ids[len(prompt_ids) - count :] if count else []), resume.text_sent


def report_progress(client: redis.Redis, replica_id: int, stage: str, fraction: float) -> None:
    """While loading: the supervisor mirrors this into the database for the console."""
    status = ReplicaStatus("loading", time.time(), progress={"stage": stage, "fraction": round(fraction, 3)})
    client.hset(protocol.status_key(replica_id), mapping=status.to_hash())


def _scheduled(req: Inflight, scheduled_at: float | None) -> float:
    """When the engine first scheduled `req` (the end of its queueing), within its arrival and first token."""
    return min(max(scheduled_at or req.arrived, req.arrived), req.first_token_at)
