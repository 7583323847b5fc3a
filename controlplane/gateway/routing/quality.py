"""Routing quality per deployment, as sums in one Redis hash (every web process adds to it).

At each routing decision that knows the prompt's token ids:
- `decisions`, and `best_prefix_decisions`: those that chose a replica holding the longest
  cached prefix of any ready replica;
- `routed_input_tokens`: the prompts' tokens;
- `reachable_tokens`: the prefix cached on the best replica the load bound allowed (what perfect
  routing could have reused);
- `predicted_tokens`: the prefix cached on the replica chosen.
When a request ends with usage, `input_tokens` and `cached_tokens` (what the engine reported it
actually reused). Achieved hit rate = cached_tokens / input_tokens; reachable = reachable_tokens /
routed_input_tokens. Sums rather than ratios, so a Prometheus server can rate them over any
window.
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis

from controlplane.gateway.routing import policies

log = logging.getLogger(__name__)
FIELDS = (
    "decisions",
    "best_prefix_decisions",
    "routed_input_tokens",
    "reachable_tokens",
    "predicted_tokens",
    "input_tokens",
    "cached_tokens",
)


def quality_key(deployment: str) -> str:
    return f"switchyard:routing:{deployment}:quality"


async def record(client: aioredis.Redis, deployment: str, plan: policies.Plan, picked, cached: dict[int, int],
                 input_tokens: int, block_size: int) -> None:  # fmt: skip
    """Count one decision (`picked`: dispatched.Pick; `cached`: leading prompt blocks per replica)."""
    cap = policies.load_cap(picked.loads, plan.load_factor)
    eligible = [c.replica_id for c, load in zip(plan.candidates, picked.loads, strict=True) if load < cap]
    best = max((cached.get(c.replica_id, 0) for c in plan.candidates), default=0)
    chosen = cached.get(picked.replica_id, 0)
    counts = {
        "decisions": 1,
        "best_prefix_decisions": int(chosen == best),
        "routed_input_tokens": input_tokens,
        "reachable_tokens": max((cached.get(rid, 0) for rid in eligible), default=0) * block_size,
        "predicted_tokens": chosen * block_size,
    }
    await _add(client, deployment, counts)


async def record_usage(client: aioredis.Redis, deployment: str, usage: dict) -> None:
    """Count a finished request's prompt tokens and those its replica served from cache."""
    counts = {"input_tokens": int(usage.get("prompt_tokens", 0)), "cached_tokens": int(usage.get("cached_tokens", 0))}
    await _add(client, deployment, counts)


async def _add(client: aioredis.Redis, deployment: str, counts: dict[str, int]) -> None:
    try:
        pipe = client.pipeline(transaction=False)
        for name, value in counts.items():
            pipe.hincrby(quality_key(deployment), name, value)
        await pipe.execute()
    except aioredis.RedisError:  # a lost count must not fail the request it counts
        log.warning("could not count routing quality of %s", deployment, exc_info=True)


def read(client, deployment: str) -> dict[str, int]:
    """The sums of one deployment (a synchronous client: `/metrics` and the deployments API)."""
    raw = client.hgetall(quality_key(deployment)) or {}
    return {name: int(raw.get(name, 0)) for name in FIELDS}
