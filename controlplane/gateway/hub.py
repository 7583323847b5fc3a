"""The web process's line to the replicas: requests out on their Redis streams, events back on
one pub/sub channel per process.

One subscriber per event loop reads every reply and hands each to the queue of its request, so
a thousand open streams cost one Redis connection, not a thousand. A request's stream also
watches its replica: if the replica's heartbeat stops or a new incarnation appears (it was
restarted), the stream ends with an error event marked `replica_lost` instead of waiting
forever (the generation then resumes the request on another replica: `failover.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator

import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from controlplane.gateway.dispatched import Dispatched
from workers.replica import protocol

log = logging.getLogger(__name__)
LIVENESS_CHECK_SECONDS = 0.5
# A request waits this long for the reply channel to be (re)subscribed before it is refused.
SUBSCRIBE_WAIT_SECONDS = 5.0
# Requests wait for a free connection rather than fail when thousands of streams are open.
MAX_CONNECTIONS = 64


class RequestStream:
    """The events of one request, in order; ends after the last delta or an error."""

    def __init__(self, hub: ReplicaHub, replica_id: int, request_id: str, incarnation: str | None):
        self.hub = hub
        self.replica_id = replica_id
        self.request_id = request_id
        self.incarnation = incarnation
        self.queue: asyncio.Queue = asyncio.Queue()
        self.finished = False

    async def next_event(self) -> dict:
        while True:
            try:
                if self.queue.empty():  # wait; asyncio.timeout costs no extra task, unlike wait_for
                    async with asyncio.timeout(LIVENESS_CHECK_SECONDS):
                        event = await self.queue.get()
                else:
                    event = self.queue.get_nowait()
            except TimeoutError:
                problem = await self.hub.replica_problem(self.replica_id, self.incarnation)
                if problem:
                    self.finished = True
                    return {"id": self.request_id, "type": "error", "status": 502, "message": problem,
                            "replica_lost": True}  # fmt: skip
                continue
            if event.get("type") == "error" or event.get("finish_reason"):
                self.finished = True
            return event

    async def __aiter__(self) -> AsyncIterator[dict]:
        while not self.finished:
            yield await self.next_event()

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
            url, decode_responses=True, max_connections=MAX_CONNECTIONS, timeout=30
        )
        self.redis = aioredis.Redis(connection_pool=pool)
        self.channel = f"switchyard:gateway:{uuid.uuid4().hex}"
        self.queues: dict[str, asyncio.Queue] = {}
        self.dispatched = Dispatched(self.redis)  # requests sent and not yet ended, per replica
        self._listener: asyncio.Task | None = None
        self._refresher: asyncio.Task | None = None
        self._subscribed = asyncio.Event()
        # replica id -> (read at, status hash): one status read per replica per interval, however
        # many of its streams are waiting.
        self._liveness: dict[int, tuple[float, dict]] = {}

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
                        event = protocol.decode(message["data"])
                    except ValueError:
                        continue
                    queue = self.queues.get(event.get("id", ""))
                    if queue is not None:
                        queue.put_nowait(event)
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

    def _fail_open_streams(self, exc: Exception) -> None:
        """Every request waiting for replies may have lost some: end each with an error event
        (the gateway answers its client cleanly; the replica aborts it when it finds Redis gone
        or when the gateway's abort arrives)."""
        for request_id, queue in list(self.queues.items()):
            queue.put_nowait({"id": request_id, "type": "error", "status": 503, "broker_lost": True,
                              "message": f"lost the connection to the request broker ({exc})"})  # fmt: skip

    async def submit(self, replica_id: int, request_id: str, message: dict, incarnation: str | None) -> RequestStream:
        await self.start()
        stream = RequestStream(self, replica_id, request_id, incarnation)
        self.queues[request_id] = stream.queue
        await self._send(replica_id, {**message, "type": "generate", "id": request_id, "reply_to": self.channel})
        return stream

    async def abort(self, replica_id: int, request_id: str) -> None:
        await self._send(replica_id, {"type": "abort", "id": request_id})

    async def _send(self, replica_id: int, message: dict) -> None:
        await self.redis.xadd(
            protocol.requests_key(replica_id),
            {"m": protocol.encode(message)},
            maxlen=protocol.REQUEST_STREAM_MAXLEN,
            approximate=True,
        )

    async def statuses(self, replica_ids: list[int]) -> list[dict]:
        pipe = self.redis.pipeline(transaction=False)
        for rid in replica_ids:
            pipe.hgetall(protocol.status_key(rid))
        return await pipe.execute()

    async def replica_problem(self, replica_id: int, incarnation: str | None) -> str | None:
        """Why the replica can no longer answer, or None while it is alive."""
        now = time.monotonic()
        checked = self._liveness.get(replica_id)
        if checked is None or now - checked[0] >= LIVENESS_CHECK_SECONDS:
            status = await self.redis.hgetall(protocol.status_key(replica_id))
            checked = self._liveness[replica_id] = (now, status)
        status = checked[1]
        if not status or status.get("state") not in ("ready", "draining"):
            return f"replica {replica_id} stopped while serving this request"
        if incarnation and status.get("incarnation") != incarnation:
            return f"replica {replica_id} restarted while serving this request"
        if not protocol.is_fresh(status):
            return f"replica {replica_id} stopped responding"
        return None


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
