"""The batch dispatcher: sends each batch's lines to the gateway at the pace the deployment's
spare capacity allows, and writes each line's result exactly once.

One dispatcher runs in each control worker process (a thread with its own event loop, started by
the `batches.dispatch` beat task, tasks.py). It leases a batch in the database (`lease_owner`,
`lease_until`, renewed every tick): one dispatcher holds a batch at a time, and when the worker
holding it dies, the lease runs out and another worker's dispatcher takes the batch over, sending
again the lines the dead one had in flight. A line goes `pending` -> `sent` (its attempt number
and the dispatcher's token) -> `done`; a result is written only by the attempt that is current
(services.write_result), so a late answer of an attempt given up on changes nothing, and the
output files, rendered from the lines, never hold a line twice or miss one.

Lines go to the web process's own API (GATEWAY_URL) with a token naming the batch
(tokens.py): routing, failover, every endpoint's checks and its response body are the gateway's.
The gateway runs them at the batch priority, below every interactive request: the engine queues
them last and preempts them first. The dispatcher keeps at most what the deployment has to spare
in flight: a fraction of its ready replicas' sequence slots (BATCH_FILL; under a TTFT SLO, less while
the interactive requests' TTFT breaks it: slo_gate.py), less the interactive requests running and
waiting there, and nothing new while interactive requests wait or the KV cache is nearly full
(one line always, so a busy fleet still moves the batch on). Batches on one deployment share
that room: the lines of every batch in flight there count, none as interactive load.

A line whose replica was lost (502 `replica_error`), or that found no replica or broker (503), or
whose connection to the gateway broke (a web restart), is sent again (up to MAX_FAILURES times
for a replica error; a 503 or a broken connection waits RETRY_SECONDS and is sent again until the
batch ends). Any other answer is the line's result: 2xx to the output file, the rest (4xx, a 500
`engine_error`, 502 `replicas_lost`: a poison request) to the error file.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from datetime import timedelta

import httpx
import redis
from django.conf import settings
from django.db import close_old_connections, connections
from django.db.models import F, Q
from django.utils import timezone

from controlplane.autoscaling.models import Autoscaling
from controlplane.batches import services
from controlplane.batches.models import Batch, BatchLine
from controlplane.batches.slo_gate import FillGate
from controlplane.batches.tokens import token_for
from controlplane.deployments.models import Deployment, Replica
from controlplane.gateway import inspector
from workers.protocol import replica as protocol
from workers.protocol.replica import ReplicaStatus
from workers.protocol.wire import ProtocolError

log = logging.getLogger(__name__)

LEASE_SECONDS = 15.0
TICK_SECONDS = 0.5  # a cancel is seen within this (and the lease renewed)
CLAIM_SECONDS = 1.0
RETRY_SECONDS = 2.0
MAX_FAILURES = 3
KV_FULL = 0.9
RETRY_STATUSES = {502: ("replica_error",), 503: None}  # None: any code


def _db(fn):
    """Run a database function on the dispatcher's one database thread (its connection is that
    thread's; an old or broken one is replaced first)."""

    def call(*args):
        close_old_connections()
        return fn(*args)

    return call


class Dispatcher:
    def __init__(self):
        self.token = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.db_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="batch-db")
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True, name="batch-dispatcher")
        self.running: dict[str, asyncio.Task] = {}
        self.gates: dict[int, FillGate] = {}  # by deployment
        self.redis = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True, socket_timeout=2)

    def close(self) -> None:
        """Let go of the database thread and its connection (tests run a dispatcher briefly)."""
        self.db_thread.submit(connections.close_all).result()
        self.db_thread.shutdown()

    async def db(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.db_thread, _db(fn), *args)

    async def _main(self) -> None:
        timeout = httpx.Timeout(None, connect=10.0)
        async with httpx.AsyncClient(base_url=settings.GATEWAY_URL, timeout=timeout) as self.client:
            while True:
                try:
                    for batch_id in await self.db(claim_batches, self.token):
                        if batch_id not in self.running:
                            self.running[batch_id] = asyncio.create_task(self._batch(batch_id))
                except Exception:  # the database or Redis away: try again next time
                    log.exception("claiming batches failed")
                for batch_id, task in list(self.running.items()):
                    if task.done():
                        del self.running[batch_id]
                        if not task.cancelled() and task.exception() is not None:
                            log.error("batch %s: %s", batch_id, task.exception(), exc_info=task.exception())
                await asyncio.sleep(CLAIM_SECONDS)

    async def _batch(self, batch_id: str) -> None:
        """Run one leased batch until it ends or the lease is lost. If anything fails here (the
        database away), the lines this dispatcher had in flight go back to pending, and the
        batch is taken up again at the next claim."""
        inflight: dict[int, asyncio.Task] = {}
        try:
            await self.db(release_lines, batch_id, self.token)  # a previous run of ours left these
            await self._run_batch(batch_id, inflight)
        finally:
            await _stop(inflight)
            with contextlib.suppress(Exception):
                await self.db(release_lines, batch_id, self.token)

    async def _run_batch(self, batch_id: str, inflight: dict[int, asyncio.Task]) -> None:
        answered = asyncio.Event()  # a line ended: its slot is refilled at once, not at the next tick
        while True:
            answered.clear()  # before looking: a line that ends from here on wakes the loop
            batch = await self.db(renew_lease, batch_id, self.token)
            if batch is None:  # another dispatcher holds it now (ours ran out): let go, write nothing
                await _stop(inflight)
                return
            ending = _ending(batch)
            if ending is not None:
                final, code, message = ending
                await _stop(inflight)
                if code:
                    await self.db(services.end_unanswered, batch, code, message)
                await self.db(services.finalize, batch, final)
                return
            for line_id in [i for i, task in inflight.items() if task.done()]:
                inflight.pop(line_id).result()  # a bug in _send surfaces here
            room = await self.db(self.capacity, batch.model, len(inflight)) - len(inflight)
            if room > 0:
                for line in await self.db(claim_lines, batch_id, self.token, room):
                    task = asyncio.create_task(self._send(batch, line))
                    task.add_done_callback(lambda _: answered.set())
                    inflight[line.pk] = task
            if not inflight and not await self.db(has_open_lines, batch_id):
                await self.db(services.finalize, batch, Batch.Status.COMPLETED)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(answered.wait(), TICK_SECONDS)

    async def _send(self, batch: Batch, line: BatchLine) -> None:
        attempt = line.attempts
        headers = {"Authorization": f"Bearer {token_for(batch.id)}"}
        try:
            response = await self.client.post(batch.endpoint, json=line.body, headers=headers)
        except httpx.HTTPError as exc:  # the web process restarted, or cannot be reached
            log.warning("batch %s line %s: %s; sending it again", batch.id, line.index, exc)
            await asyncio.sleep(RETRY_SECONDS)
            await self.db(release_line, line, self.token, attempt, False)
            return
        try:
            body = response.json()
        except ValueError:
            body = {"error": {"message": response.text[:1000], "type": "server_error"}}
        code = (body.get("error") or {}).get("code") if isinstance(body, dict) else None
        codes = RETRY_STATUSES.get(response.status_code, ())
        if codes is None or code in codes:
            counted = response.status_code == 502
            if not counted or line.failures + 1 < MAX_FAILURES:
                await asyncio.sleep(RETRY_SECONDS if not counted else 0)
                await self.db(release_line, line, self.token, attempt, counted)
                return
        ok = 200 <= response.status_code < 300
        result = services.line_result(line, response.status_code, body, response.headers.get("x-request-id"))
        await self.db(services.write_result, line, self.token, attempt, ok, result)

    def capacity(self, model: str | None, inflight: int) -> int:
        """How many lines this batch (`inflight` of its lines in flight) may have in flight now,
        its share of what the deployment has to spare for every batch (the module's docstring)."""
        deployment = Deployment.objects.filter(slug=model or "").first()
        if deployment is None:  # its lines fail with the gateway's 404: one at a time
            return 1
        ready = Replica.objects.filter(deployment=deployment, state=Replica.State.READY).values_list("pk", flat=True)
        ready = list(ready)
        if not ready:
            return 0
        try:
            pipe = self.redis.pipeline(transaction=False)
            for pk in ready:
                pipe.hgetall(protocol.status_key(pk))
            raws = pipe.execute()
            fill = self.fill(deployment, len(ready))
        except redis.RedisError:  # the gateway is blind too: keep one line going
            return 1
        running = waiting = free = total = 0
        for raw in raws:
            try:
                load = ReplicaStatus.from_hash(raw).load if raw else {}
            except ProtocolError:
                load = {}
            running += load.get("running", 0)
            waiting += load.get("waiting", 0)
            free += load.get("kv_blocks_free", 0)
            total += load.get("kv_blocks_total", 0)
        # Every batch's lines on this deployment share the room: none is taken for interactive load.
        lines = BatchLine.objects.filter(state=BatchLine.State.SENT, batch__model=model, batch__status__in=Batch.ACTIVE)
        batched = max(lines.count(), inflight)
        slots = int(len(ready) * deployment.max_num_seqs * fill)
        interactive = max(0, running + waiting - batched)
        limit = max(1, slots - interactive)
        if waiting > batched or (total and 1 - free / total > KV_FULL):  # interactive requests queue: hold
            limit = max(1, min(limit, batched))
        return max(inflight + limit - batched, 1)  # each batch keeps one line going

    def fill(self, deployment: Deployment, replicas: int) -> float:
        """The fraction of the deployment's sequence slots its batch lines may take now."""
        slo = Autoscaling.objects.filter(deployment=deployment).values_list("ttft_p90_ms", flat=True).first()
        if slo is None:
            return settings.BATCH_FILL
        now = time.time()
        gate = self.gates.get(deployment.pk)
        if gate is None:  # from now: what ended before is another dispatcher's past
            gate = self.gates[deployment.pk] = FillGate(settings.BATCH_FILL, 0.0, checked_at=now, seen_until=now)
        gate.floor = min(1 / (replicas * deployment.max_num_seqs), gate.ceiling)  # one line
        if gate.due(now):
            before = gate.fill
            ended = inspector.interactive_ttfts(self.redis, deployment.slug, gate.seen_until)
            gate.adjust(now, ended, slo)
            if gate.fill < before:
                log.info(
                    "batch lines on %s: fill %.2f -> %.2f, interactive TTFT p90 over its SLO (%g ms)",
                    deployment.slug,
                    before,
                    gate.fill,
                    slo,
                )
        return gate.fill


def _ending(batch: Batch) -> tuple[str, str, str] | None:
    if batch.status == Batch.Status.CANCELLING:
        return Batch.Status.CANCELLED, "batch_cancelled", "The batch was cancelled before this request ran."
    if timezone.now() >= batch.expires_at:
        return Batch.Status.EXPIRED, "batch_expired", "This request could not be run before the batch expired."
    if batch.status == Batch.Status.FINALIZING:  # a dispatcher died while finishing it
        return Batch.Status.COMPLETED, "", ""
    return None


async def _stop(inflight: dict[int, asyncio.Task]) -> None:
    """Cancel the requests in flight (closing their connections aborts them in the replicas)."""
    for task in inflight.values():
        task.cancel()
    await asyncio.gather(*inflight.values(), return_exceptions=True)
    inflight.clear()


# -- the database side (run on the dispatcher's database thread) ------------------------------------
def _free_or_mine(token: str, now) -> Q:
    return Q(lease_owner=token) | Q(lease_until__isnull=True) | Q(lease_until__lt=now)


def claim_batches(token: str) -> list[str]:
    """Lease the active batches no live dispatcher holds. Lines another dispatcher sent and never
    answered are sent again."""
    now = timezone.now()
    free = Batch.objects.filter(_free_or_mine(token, now), status__in=Batch.ACTIVE)
    ids = list(free.values_list("id", flat=True)[:50])
    claimed = []
    for batch_id in ids:
        taken = Batch.objects.filter(_free_or_mine(token, now), pk=batch_id, status__in=Batch.ACTIVE).update(
            lease_owner=token, lease_until=now + timedelta(seconds=LEASE_SECONDS)
        )
        if taken:
            BatchLine.objects.filter(batch_id=batch_id, state=BatchLine.State.SENT).exclude(sent_by=token).update(
                state=BatchLine.State.PENDING
            )
            claimed.append(batch_id)
    return claimed


def renew_lease(batch_id: str, token: str) -> Batch | None:
    now = timezone.now()
    renewed = Batch.objects.filter(pk=batch_id, lease_owner=token, status__in=Batch.ACTIVE).update(
        lease_until=now + timedelta(seconds=LEASE_SECONDS)
    )
    return Batch.objects.filter(pk=batch_id).first() if renewed else None


def claim_lines(batch_id: str, token: str, n: int) -> list[BatchLine]:
    """Up to `n` pending lines, in input order, marked sent by `token` (their attempt numbered)."""
    claimed = []
    pending = BatchLine.objects.filter(batch_id=batch_id, state=BatchLine.State.PENDING).order_by("index")
    for line in pending.only("pk")[:n]:
        # Only while the batch is still ours: a dispatcher whose lease ran out sends nothing more.
        if BatchLine.objects.filter(pk=line.pk, state=BatchLine.State.PENDING, batch__lease_owner=token).update(
            state=BatchLine.State.SENT, sent_by=token, attempts=F("attempts") + 1
        ):
            claimed.append(BatchLine.objects.get(pk=line.pk))
    return claimed


def release_line(line: BatchLine, token: str, attempt: int, failed: bool) -> None:
    """Back to pending, to be sent again (if it is still this attempt)."""
    BatchLine.objects.filter(pk=line.pk, state=BatchLine.State.SENT, sent_by=token, attempts=attempt).update(
        state=BatchLine.State.PENDING, failures=F("failures") + int(failed)
    )


def release_lines(batch_id: str, token: str) -> None:
    """The lines `token` sent and has no answer for (its run of the batch ended): pending again."""
    BatchLine.objects.filter(batch_id=batch_id, state=BatchLine.State.SENT, sent_by=token).update(
        state=BatchLine.State.PENDING
    )


def has_open_lines(batch_id: str) -> bool:
    return BatchLine.objects.filter(batch_id=batch_id).exclude(state=BatchLine.State.DONE).exists()


_dispatcher: Dispatcher | None = None
_lock = threading.Lock()


def ensure_running() -> Dispatcher:
    """This process's dispatcher, started if it is not running."""
    global _dispatcher
    with _lock:
        if _dispatcher is None or not _dispatcher.thread.is_alive():
            _dispatcher = Dispatcher()
            _dispatcher.thread.start()
        return _dispatcher
