"""Which replica serves a request, and why: the facts for the routing policies (`policies.py`), gathered.

For one request the router reads, in a few Redis round trips: the ready replicas' heartbeats
(stale ones are skipped), the session key's binding, the blocks of the prompt each replica holds
(`workers.protocol.kv_blocks`, when the policy is KV-aware and the gateway has the prompt's
token ids), for a keyless prompt how many earlier prompts' cached prefixes ended where its own
does (a shared prefix: `policies.shared_prefix`), and the round-robin turn. `policies.plan` turns
them into a plan; the pick itself, the count of the request against the replica and the
session's (re)binding are one atomic step in Redis (`dispatched.py`). The choice is explained
in `x-switchyard-route-reason` and the prefix the replica should find cached in
`x-switchyard-cached-tokens-predicted`; the routing
quality counters (`quality.py`) add it up per deployment.

It raises `NoReadyReplica` rather than an HTTP error; the generation turns it into one.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from controlplane.deployments import routing_policies
from controlplane.deployments.models import CachePolicy, Deployment
from controlplane.gateway.hub import ReplicaHub
from controlplane.gateway.routing import policies, quality
from workers.protocol import kv_blocks
from workers.protocol.replica import ReplicaStatus

STALE_RETRIES = 5
STALE_RETRY_SECONDS = 0.2


class NoReadyReplica(Exception):
    """No ready replica with a fresh heartbeat; `failed`: the deployment gave up (its failure
    budget is spent), so waiting will not help."""

    def __init__(self, deployment: Deployment):
        self.deployment = deployment
        self.failed = deployment.failed_at is not None
        super().__init__(f"no ready replica of {deployment.slug}")


@dataclass
class Route:
    replica_id: int
    reason: str
    incarnation: str | None
    prefill_replica_id: int | None = None  # disaggregated: who computes the prompt
    predicted_cached_tokens: int | None = None  # None: the gateway could not tell (no token ids)


@dataclass(frozen=True)
class Settings:
    """A deployment's routing settings, from its cache policy (defaults without one)."""

    policy: str = routing_policies.DEFAULT_POLICY
    load_factor: float = routing_policies.DEFAULT_LOAD_FACTOR
    session_ttl: int = 600
    block_size: int = 16
    prefix_caching: bool = True

    @classmethod
    def of(cls, deployment: Deployment) -> Settings:
        policy: CachePolicy | None = deployment.cache_policy
        if policy is None:
            return cls()
        return cls(
            policy.routing,
            policy.affinity_load_factor,
            policy.session_affinity_ttl_seconds,
            policy.block_size,
            policy.prefix_caching,
        )


def affinity_key(deployment: str, session: str) -> str:
    return f"switchyard:affinity:{deployment}:{session}"


def round_robin_key(deployment: str) -> str:
    return f"switchyard:routing:{deployment}:turn"


def prefix_end_key(deployment: str, block_hash: int) -> str:
    return f"switchyard:routing:{deployment}:prefix_end:{block_hash}"


def conversations_key(deployment: str) -> str:
    """The block hashes where keyless conversations began (their first block past a shared prefix)."""
    return f"switchyard:routing:{deployment}:conversations"


def conversation_recent_key(deployment: str, block_hash: int) -> str:
    """The requests of the keyless conversation that began at `block_hash`, lately."""
    return f"switchyard:routing:{deployment}:conversation:{block_hash}:recent"


async def _conversation(
    hub: ReplicaHub, cfg: Settings, slug: str, plan: policies.Plan, hashes: list[int], cached: dict[int, int]
) -> int | None:
    """A keyless prompt's conversation, as the block it began at, so that its requests count as
    one conversation's (a session key's stand-in for `policies.pick`'s rebalancing). A new
    conversation begins at its first block past the longest cached prefix (registered here for
    the session TTL: a sorted set scored by expiry, trimmed as it is written); a continued one at
    the deepest live beginning its prompt holds (a sub-agent forked from a parent's context
    counts with the parent, as under one session key)."""
    key, now = conversations_key(slug), time.time()
    ttl = max(cfg.session_ttl, 1)
    if plan.fresh:
        start = hashes[min(max(cached.values(), default=0), len(hashes) - 1)]
        async with hub.redis.pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(key, "-inf", now)
            pipe.zadd(key, {str(start): now + ttl})
            pipe.expire(key, ttl)
            await pipe.execute()
        return start
    if not plan.rebalance:
        return None
    scores = await hub.redis.zmscore(key, [str(h) for h in hashes])
    return next((h for h, sc in zip(reversed(hashes), reversed(scores), strict=True) if sc and sc > now), None)


async def _shared_blocks(hub: ReplicaHub, cfg: Settings, slug: str, hashes: list[int], cached: dict[int, int]) -> int:
    """How many of the prompt's leading blocks many conversations share (`policies.shared_prefix`),
    counting this prompt among those whose longest cached prefix ended at that block (each count
    lives for the session TTL after its last prompt)."""
    best = max(cached.values(), default=0)
    if not best:
        return 0
    key = prefix_end_key(slug, hashes[best - 1])
    async with hub.redis.pipeline(transaction=False) as pipe:
        pipe.incr(key)
        pipe.expire(key, max(cfg.session_ttl, 1))
        count, _ = await pipe.execute()
    return policies.shared_prefix(best, int(count) - 1)


Live = list[tuple[int, ReplicaStatus]]


async def _live(hub: ReplicaHub, decode: list[int], prefill: list[int]) -> tuple[Live, Live]:
    """The ready replicas with a fresh heartbeat among `decode` and among `prefill`, read in one
    round trip."""
    ids = decode + prefill
    pairs = list(zip(ids, await hub.statuses(ids) if ids else [], strict=True))

    def ready(part: Live) -> Live:
        return [(rid, st) for rid, st in part if st.state == "ready" and st.is_fresh()]

    return ready(pairs[: len(decode)]), ready(pairs[len(decode) :])


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


async def _facts(
    hub: ReplicaHub, cfg: Settings, slug: str, ids: list[int], session: str | None, hashes: list[int]
) -> tuple[int | None, dict[int, int], int]:
    """The session's binding and the round-robin turn (each read only when the policy uses it),
    and the leading prompt blocks each replica holds."""
    bound = cached = turn = None
    if session is not None and cfg.policy in (policies.SESSION, policies.SESSION_KV_AWARE):
        bound = await hub.redis.get(affinity_key(slug, session))
    if hashes:  # every policy: the prediction header and the quality counters need it too
        cached = await kv_blocks.cached_blocks(hub.redis, ids, hashes)
    if cfg.policy == policies.ROUND_ROBIN:
        turn = await hub.redis.incr(round_robin_key(slug))
    bound_to = int(bound) if bound is not None and str(bound).isdigit() else None
    return bound_to, cached or {}, int(turn or 0)


async def choose(
    hub: ReplicaHub,
    deployment: Deployment,
    candidates: dict[str, list[int]],
    request_id: str,
    session: str | None = None,
    exclude: frozenset[int] = frozenset(),
    prompt_ids: list[int] | None = None,
) -> Route:
    """The replica for `request_id`, which counts against it from now until the request's
    stream is closed. Raises NoReadyReplica."""
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
    if not live:
        raise NoReadyReplica(deployment)

    cfg = Settings.of(deployment)
    block_size = next((st.kv_block_size for _, st in live if st.kv_block_size), cfg.block_size)
    hashes = kv_blocks.prefix_hashes(prompt_ids, block_size) if prompt_ids and cfg.prefix_caching else []
    live_ids = [rid for rid, _ in live]
    bound_to, cached, turn = await _facts(hub, cfg, deployment.slug, live_ids, session, hashes)
    views = [policies.Candidate(rid, *_decode_load(st), cached.get(rid, 0)) for rid, st in live]
    shared = 0
    if hashes and (cfg.policy == policies.KV_AWARE or (cfg.policy == policies.SESSION_KV_AWARE and session is None)):
        shared = await _shared_blocks(hub, cfg, deployment.slug, hashes, cached)
    plan = policies.plan(cfg.policy, views, session=session, bound_to=bound_to, prompt_blocks=len(hashes),
                        turn=turn, load_factor=cfg.load_factor, shared_blocks=shared)  # fmt: skip
    key = affinity_key(deployment.slug, session) if plan.session is not None else None
    own = None
    if plan.session is None and hashes and plan.recent:
        start = await _conversation(hub, cfg, deployment.slug, plan, hashes, cached)
        own = conversation_recent_key(deployment.slug, start) if start is not None else None
    picked = await hub.dispatched.pick(request_id, plan, key, cfg.session_ttl, own_key=own)

    reason = plan.reason if len(live) > 1 else "only_ready_replica"
    if picked.kept_binding:
        reason = "session_bound"
    elif plan.session is not None and bound_to is not None:
        reason += ";session_moved"  # its replica left, is over the load bound or was sent too many
    elif picked.rebalanced:
        reason += ";rebalanced"  # a continued keyless turn, its replica sent over its share lately
    predicted = None
    if prompt_ids:
        predicted = cached.get(picked.replica_id, 0) * block_size
        await quality.record(hub.redis, deployment.slug, plan, picked, cached, len(prompt_ids), block_size)
    route = Route(
        picked.replica_id, reason, dict(live)[picked.replica_id].incarnation or None, predicted_cached_tokens=predicted
    )
    if disaggregated:
        if prefills:
            route.prefill_replica_id = min(prefills, key=lambda pair: (_prefill_score(pair[1]), pair[0]))[0]
            route.reason += ";prefill_least_tokens"
        else:  # the decode replica prefills by itself
            route.reason += ";no_prefill_replica"
    return route
