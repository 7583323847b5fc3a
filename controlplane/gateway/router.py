"""Which replica serves a request, and why.

For now: the least-loaded ready replica of the deployment. Its load is the larger of what its
heartbeat reports (running + waiting requests and handoffs) and the requests the gateway has
sent it and not yet seen end (`dispatched.py`: counted in Redis across web processes, and
counted in the same step as the choice, so a burst spreads); ties go to the most free KV
blocks, then the lowest id. The `x-session-affinity` key is recorded in the session-affinity
table (Redis) with the replica chosen, so that the caching work can route by it. The reason is
returned to the client in `x-switchyard-route-reason`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from controlplane.deployments.models import Deployment, Replica
from controlplane.gateway.hub import ReplicaHub
from controlplane.gateway.openai_request import OpenAIError
from workers.protocol.replica import ReplicaStatus

STALE_RETRIES = 5
STALE_RETRY_SECONDS = 0.2


@dataclass
class Route:
    replica_id: int
    reason: str
    incarnation: str | None
    prefill_replica_id: int | None = None  # disaggregated: who computes the prompt


def affinity_key(deployment: str, session: str) -> str:
    return f"switchyard:affinity:{deployment}:{session}"


def candidate_ids(deployment_id: int) -> dict[str, list[int]]:
    """Ready replicas by what they do: "decode" (colocated or decode role) and "prefill".
    The caller is synchronous."""
    out: dict[str, list[int]] = {"decode": [], "prefill": []}
    rows = Replica.objects.filter(deployment_id=deployment_id, state=Replica.State.READY).order_by("id")
    for rid, role in rows.values_list("id", "role"):
        out["prefill" if role == Replica.Role.PREFILL else "decode"].append(rid)
    return out


def _decode_load(status: ReplicaStatus) -> tuple[int, int]:
    """Decode side, as the heartbeat reports it: requests in flight (handoffs included), free KV
    blocks."""
    load = status.load
    queued = int(load.get("running", 0)) + int(load.get("waiting", 0)) + int(load.get("handoffs_waiting", 0))
    return queued, int(load.get("kv_blocks_free", 0))


def _prefill_score(status: ReplicaStatus) -> tuple:
    """Prefill side: prompt tokens it is still computing, then requests waiting."""
    load = status.load
    return (int(load.get("prefill_tokens_inflight", 0)), int(load.get("waiting", 0)))


Live = list[tuple[int, ReplicaStatus]]


async def _live(hub: ReplicaHub, decode: list[int], prefill: list[int]) -> tuple[Live, Live]:
    """The ready replicas with a fresh heartbeat among `decode` and among `prefill`, read in one
    round trip."""
    ids = decode + prefill
    pairs = list(zip(ids, await hub.statuses(ids) if ids else [], strict=True))

    def ready(part: Live) -> Live:
        return [(rid, st) for rid, st in part if st.state == "ready" and st.is_fresh()]

    return ready(pairs[: len(decode)]), ready(pairs[len(decode) :])


async def choose(
    hub: ReplicaHub,
    deployment: Deployment,
    candidates: dict[str, list[int]],
    request_id: str,
    session: str | None = None,
    exclude: frozenset[int] = frozenset(),
) -> Route:
    """The replica for `request_id`, which counts against it from now until the request's
    stream is closed."""
    ids = [i for i in candidates["decode"] if i not in exclude]
    disaggregated = deployment.mode == Deployment.Mode.DISAGGREGATED
    prefill_ids = candidates["prefill"] if disaggregated else []
    live, prefills = await _live(hub, ids, prefill_ids)
    for _ in range(STALE_RETRIES):
        if live or not ids:
            break
        # Ready in the database but no fresh heartbeat: a replica under a burst of load can be
        # late by a moment; look again briefly before refusing the request.
        await asyncio.sleep(STALE_RETRY_SECONDS)
        live, prefills = await _live(hub, ids, prefill_ids)
    if not live and deployment.failed_at is not None:  # gave up: waiting will not help
        raise OpenAIError(
            503,
            f"Deployment '{deployment.slug}' has failed: {deployment.failed_reason}. It is not retrying;"
            f" an operator must restart it (POST /api/v1/deployments/{deployment.slug}/restart/).",
            code="deployment_failed",
        )
    if not live:
        raise OpenAIError(
            503,
            f"Deployment '{deployment.slug}' has no ready replica right now; try again shortly.",
            code="no_ready_replica",
            headers={"Retry-After": "2"},
        )
    rid, _ = await hub.dispatched.pick(request_id, [(i, *_decode_load(st)) for i, st in live])
    status = dict(live)[rid]
    reason = "least_loaded" if len(live) > 1 else "only_ready_replica"
    if session:
        ttl = deployment.cache_policy.session_affinity_ttl_seconds if deployment.cache_policy else 600
        await hub.redis.set(affinity_key(deployment.slug, session), rid, ex=max(ttl, 1))
        reason += ";session_recorded"
    route = Route(rid, reason, status.incarnation or None)
    if disaggregated:
        if prefills:
            route.prefill_replica_id = min(prefills, key=lambda pair: (_prefill_score(pair[1]), pair[0]))[0]
            route.reason += ";prefill_least_tokens"
        else:  # the decode replica prefills by itself
            route.reason += ";no_prefill_replica"
    return route
