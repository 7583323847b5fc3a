"""The web process's line to the replicas: requests out on their Redis streams, events back on
one pub/sub channel per process.

One subscriber per event loop reads every reply and hands each to the queue of its request, so
a thousand open streams cost one Redis connection, not a thousand. A request's stream also
watches its replica: if the replica's heartbeat stops or a new incarnation appears (it was
restarted), the stream is closed (the replica told to abort the request, should it wake up) and
ends with an error event of code `replica_lost` instead of waiting forever (the generation then
resumes the request on another replica: `failover.py`).
Messages and events are the typed ones of `workers.protocol.replica`, which the replica shares.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import replace

import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from controlplane.gateway.routing.dispatched import Dispatched
from workers.protocol import replica as protocol
from workers.protocol.replica import AbortMessage, ErrorEvent, Event, GenerateMessage, ReplicaStatus, read_event
from workers.protocol.wire import ProtocolError

log = logging.getLogger(__name__)
LIVENESS_CHECK_SECONDS = 0.5
# A request waits this long for the reply channel to be (re)subscribed before it is refused.
SUBSCRIBE_WAIT_SECONDS = 5.0
# Requests wait for a free connection rather than fail when thousands of streams are open.
MAX_CONNECTIONS = 64
# A pooled connection that outlived a Redis restart fails its next command with "Connection
# closed by server" (redis-py notices only then); the command is sent again on a new connection.
# Such a command never reached the new server; a duplicate from a server that died after
# executing it is dropped by the replica (it ignores a `generate` whose id it already has).
CONNECTION_RETRIES = 2
# Codes of the error events the gateway makes itself (a replica never sends them).
REPLICA_LOST = "replica_lost"  # it stopped, hung or restarted under the request: resume it elsewhere
BROKER_LOST = "broker_lost"  # the reply channel lost Redis: what was published meanwhile is lost


class RequestStream:
    """The events of one request, in order; ends after the last delta or an error."""

    def __init__(self, hub: ReplicaHub, replica_id: int, request_id: str, incarnation: str | None):
        self.hub = hub
        self.replica_id = replica_id
        self.request_id = request_id
        self.incarnation = incarnation
        self.queue: asyncio.Queue = asyncio.Queue()
        self.finished = False
        self.samples_left = 1  # `n`: one final delta per sample ends the stream

    async def next_event(self) -> Event:
        while True:
            try:
                if self.queue.empty():  # wait; asyncio.timeout costs no extra task, unlike wait_for
                    async with asyncio.timeout(LIVENESS_CHECK_SECONDS):
                        event = await self.queue.get()
                else:
                    event = self.queue.get_nowait()
            except TimeoutError:
                problem = await self.hub.replica_problem(self.replica_id, self.incarnation)
                if problem:  # closed now: uncounted, and aborted so that a hung replica that wakes up drops it
                    await self.close()
                    return ErrorEvent(self.request_id, 502, problem, code=REPLICA_LOST)
                continue
            if event.final:
                self.samples_left -= 1
                self.finished = self.samples_left <= 0
            return event

    async def close(self) -> None:
        """Stop listening; if the request is still running, tell the replica to abort it. Either
        way it no longer counts against the replica."""
        self.hub.queues.pop(self.request_id, None)
        try:
            if not self.finished:
                self.finished = True
                await self.hub.abort(self.replica_id, self.request_id)
        except RedisError as exc:  # Redis is away: the replica aborts its requests itself
            log.warning("could not abort %s: %s", self.request_id, exc)
        finally:
            try:
                await self.hub.dispatched.done(self.request_id)
            except RedisError as exc:  # its entry expires by itself
                log.warning("could not uncount %s: %s", self.request_id, exc)


class ReplicaHub:
    def __init__(self, url: str):
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            decode_responses=True,
            max_connections=MAX_CONNECTIONS,
            timeout=30,
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.01), CONNECTION_RETRIES),
            retry_on_error=[RedisConnectionError],
        )
        self.redis = aioredis.Redis(connection_pool=pool)
        self.channel = f"switchyard:gateway:{uuid.uuid4().hex}"
        self.queues: dict[str, asyncio.Queue] = {}
        self.dispatched = Dispatched(self.redis)  # requests sent and not yet ended, per replica
        self._listener: asyncio.Task | None = None
        self._refresher: asyncio.Task | None = None
        self._subscribed = asyncio.Event()
        # replica id -> (read at, status): one status read per replica per interval, however
        # many of its streams are waiting.
        self._liveness: dict[int, tuple[float, ReplicaStatus]] = {}

    async def start(self) -> None:
        """Start listening (once) and wait until replies can be received: a request sent while
        the reply channel is not subscribed could lose its answer and wait forever."""
        if self._listener is None:
            loop = asyncio.get_running_loop()
            self._listener = loop.create_task(self._listen(), name="replica-hub")
            self._refresher = loop.create_task(self.dispatched.keep_fresh(), name="dispatched-refresh")
        try:
            async with asyncio.timeout(SUBSCRIBE_WAIT_SECONDS):
                await self._subscribed.wait()
        except TimeoutError:
            raise RedisConnectionError("the reply channel is not subscribed (Redis unreachable)") from None

    async def _listen(self) -> None:
        while True:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                self._subscribed.set()
                async for message in pubsub.listen():
                    if message.get("type") != "message":
                        continue
                    try:
                        data = protocol.decode(message["data"])
                    except ValueError:
                        continue
                    rid = data.get("id") if isinstance(data, dict) else None
                    queue = self.queues.get(rid) if isinstance(rid, str) else None
                    if queue is not None:
                        queue.put_nowait(self._read(data))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a dropped connection: what was published meanwhile is lost
                self._subscribed.clear()
                self._fail_open_streams(exc)
                log.warning("reply listener lost Redis (%s); resubscribing", exc)
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    @staticmethod
    def _read(data: dict) -> Event:
        """A replica's event; one this side cannot read ends its request with an error."""
        try:
            return read_event(data)
        except ProtocolError as exc:
            log.warning("unreadable event for %s: %s", data.get("id"), exc)
            return ErrorEvent(
                data["id"], 502, f"the replica sent an event this gateway cannot read ({exc})", code="replica_error"
            )

    def _fail_open_streams(self, exc: Exception) -> None:
        """Every request waiting for replies may have lost some: end each with an error event
        (the gateway answers its client cleanly; the replica aborts it when it finds Redis gone).
        The stream counts as finished, so no abort is sent: a replica that kept Redis (only this
        connection dropped) finishes the request unheard."""
        for request_id, queue in list(self.queues.items()):
            queue.put_nowait(
                ErrorEvent(request_id, 503, f"lost the connection to the request broker ({exc})", code=BROKER_LOST)
            )

    async def submit(
        self, replica_id: int, request_id: str, message: GenerateMessage, incarnation: str | None
    ) -> RequestStream:
        await self.start()
        stream = RequestStream(self, replica_id, request_id, incarnation)
        stream.samples_left = message.params.n
        self.queues[request_id] = stream.queue
        await self._send(replica_id, replace(message, id=request_id, reply_to=self.channel))
        return stream

    async def abort(self, replica_id: int, request_id: str) -> None:
        await self._send(replica_id, AbortMessage(request_id))

    async def _send(self, replica_id: int, message: GenerateMessage | AbortMessage) -> None:
        await self.redis.xadd(
            protocol.requests_key(replica_id),
            {"m": protocol.encode(message.to_wire())},
            maxlen=protocol.REQUEST_STREAM_MAXLEN,
            approximate=True,
        )

    async def statuses(self, replica_ids: list[int]) -> list[ReplicaStatus]:
        pipe = self.redis.pipeline(transaction=False)
        for rid in replica_ids:
            pipe.hgetall(protocol.status_key(rid))
        return [_status(rid, raw) for rid, raw in zip(replica_ids, await pipe.execute(), strict=True)]

    async def replica_problem(self, replica_id: int, incarnation: str | None) -> str | None:
        """Why the replica can no longer answer, or None while it is alive."""
        now = time.monotonic()
        checked = self._liveness.get(replica_id)
        if checked is None or now - checked[0] >= LIVENESS_CHECK_SECONDS:
            status = _status(replica_id, await self.redis.hgetall(protocol.status_key(replica_id)))
            checked = self._liveness[replica_id] = (now, status)
        status = checked[1]
        if not status.serving:
            return f"replica {replica_id} stopped while serving this request"
        if incarnation and status.incarnation != incarnation:
            return f"replica {replica_id} restarted while serving this request"
        if not status.is_fresh():
            return f"replica {replica_id} stopped responding"
        return None


def _status(replica_id: int, raw: dict) -> ReplicaStatus:
    """A replica's status hash; one this side cannot read counts as no report (not ready)."""
    try:
        return ReplicaStatus.from_hash(raw)
    except ProtocolError as exc:
        log.warning("replica %s: unreadable status hash (%s)", replica_id, exc)
        return ReplicaStatus()


_hubs: dict[asyncio.AbstractEventLoop, ReplicaHub] = {}


def get_hub() -> ReplicaHub:
    """The hub of the running event loop (uvicorn has one; tests may run several)."""
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        for old in [lp for lp in _hubs if lp.is_closed()]:
            _hubs.pop(old, None)
        hub = _hubs[loop] = ReplicaHub(settings.REDIS_URL)
    return hub
