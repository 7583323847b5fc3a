"""Which replica serves a request, and why.

For now: the least-loaded ready replica of the deployment (fewest running + waiting requests,
then most free KV blocks). The `x-session-affinity` key is recorded in the session-affinity
table (Redis) with the replica chosen, so that the caching work can route by it. The reason is
returned to the client in `x-switchyard-route-reason`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from controlplane.deployments.models import Deployment, Replica
from controlplane.gateway.hub import ReplicaHub
from controlplane.gateway.openai_request import OpenAIError
from workers.replica import protocol

STALE_RETRIES = 5
STALE_RETRY_SECONDS = 0.2


@dataclass
class Route:
    replica_id: int
    reason: str
    incarnation: str | None
    max_model_len: int | None = None


def affinity_key(deployment: str, session: str) -> str:
    return f"switchyard:affinity:{deployment}:{session}"


def candidate_ids(deployment_id: int) -> list[int]:
    """Ready replicas that decode (colocated or decode role); the caller is synchronous."""
    roles = (Replica.Role.COLOCATED, Replica.Role.DECODE)
    return list(
        Replica.objects.filter(deployment_id=deployment_id, state=Replica.State.READY, role__in=roles)
        .order_by("id")
        .values_list("id", flat=True)
    )


def _load_score(status: dict) -> tuple:
    try:
        load = json.loads(status.get("load") or "{}")
    except ValueError:
        load = {}
    queued = int(load.get("running", 0)) + int(load.get("waiting", 0))
    return (queued, -int(load.get("kv_blocks_free", 0)))


async def _live(hub: ReplicaHub, ids: list[int]) -> list[tuple[int, dict]]:
    statuses = await hub.statuses(ids) if ids else []
    return [
        (rid, st) for rid, st in zip(ids, statuses, strict=True) if st.get("state") == "ready" and protocol.is_fresh(st)
    ]


async def choose(
    hub: ReplicaHub,
    deployment: Deployment,
    candidates: list[int],
    session: str | None = None,
    exclude: frozenset[int] = frozenset(),
) -> Route:
    ids = [i for i in candidates if i not in exclude]
    live = await _live(hub, ids)
    for _ in range(STALE_RETRIES):
        if live or not ids:
            break
        # Ready in the database but no fresh heartbeat: a replica under a burst of load can be
        # late by a moment; look again briefly before refusing the request.
        await asyncio.sleep(STALE_RETRY_SECONDS)
        live = await _live(hub, ids)
    if not live:
        raise OpenAIError(
            503,
            f"Deployment '{deployment.slug}' has no ready replica right now; try again shortly.",
            code="no_ready_replica",
            headers={"Retry-After": "2"},
        )
    rid, status = min(live, key=lambda pair: (_load_score(pair[1]), pair[0]))
    reason = "least_loaded" if len(live) > 1 else "only_ready_replica"
    try:
        endpoint = json.loads(status.get("endpoint") or "{}")
    except ValueError:
        endpoint = {}
    if session:
        ttl = deployment.cache_policy.session_affinity_ttl_seconds if deployment.cache_policy else 600
        await hub.redis.set(affinity_key(deployment.slug, session), rid, ex=max(ttl, 1))
        reason += ";session_recorded"
    return Route(rid, reason, status.get("incarnation"), endpoint.get("max_model_len"))
