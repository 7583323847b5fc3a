"""Replica processes that exited unexpectedly: each is a `replica.crashed` event (exit code or
signal, the last lines of its log, the request it is attributed to) and a count in Redis for
`/metrics` (`switchyard_replica_crashes_total`), written by the control worker as it applies the
agent's report (node_sync.py)."""

from __future__ import annotations

import logging

from django.db import transaction
from redis.exceptions import RedisError

from controlplane.common import redis as redis_client
from controlplane.deployments.models import Replica
from controlplane.events.services import record_event
from workers.protocol.control import ReplicaEvent

log = logging.getLogger(__name__)
# Hash: "<deployment slug>:attributed" / "<deployment slug>:unattributed" -> count.
COUNTS_KEY = "switchyard:replica-crashes"
TAIL_LINES = 30


def is_crash(event: ReplicaEvent) -> bool:
    """An exit the agent did not ask for (a replica that could not be started at all has no
    exit code: it never ran)."""
    return event.kind == "exited" or (event.kind == "failed" and (event.exit_code is not None or event.signal))


def record_crash(replica: Replica, event: ReplicaEvent) -> None:
    """The `replica.crashed` event of one unexpected exit, and its count (after commit: a rolled
    back report is applied again, and must not count twice)."""
    lines = event.log_tail.splitlines()[-TAIL_LINES:]
    data = {
        "deployment": replica.deployment.slug,
        "node": event.node,
        "exit_code": event.exit_code,
        "signal": event.signal or None,
        "error": event.error,
        "restart_count": event.restart_count,
        "request_id": event.request_id or None,
        "counted": event.counted,
        "gave_up": event.kind == "failed",
        "log_tail": "\n".join(lines),
    }
    record_event("replica.crashed", replica, actor_label=f"agent:{event.node}", data=data)
    outcome = "unattributed" if event.counted else "attributed"
    slug = replica.deployment.slug
    transaction.on_commit(lambda: _count(slug, outcome))


def _count(slug: str, outcome: str) -> None:
    try:
        redis_client.client().hincrby(COUNTS_KEY, f"{slug}:{outcome}", 1)
    except RedisError:  # a lost count must not fail the report it counts
        log.warning("could not count a crash of a %s replica", slug, exc_info=True)


def counts(client) -> dict[str, dict[str, int]]:
    """{deployment slug: {"attributed": n, "unattributed": n}} (for `/metrics`)."""
    out: dict[str, dict[str, int]] = {}
    for name, value in (client.hgetall(COUNTS_KEY) or {}).items():
        slug, _, outcome = name.rpartition(":")
        if outcome in ("attributed", "unattributed"):
            out.setdefault(slug, {"attributed": 0, "unattributed": 0})[outcome] = int(value)
    return out
