"""Requests the gateway has sent to each replica and not yet seen end, counted in Redis so that
every web process sees every other's.

A replica's heartbeat reports its load every 0.5 s, so a burst that arrives within one
heartbeat sees every replica idle and, routed on the heartbeat alone, lands on one of them. The
router therefore picks on `max(reported, dispatched)`: each is a lower bound of what the replica
has to do (the report lags; the count misses work that did not come through a gateway), and
the pick and the increment happen in one Lua script, so concurrent pickers in any number of
web processes see each other's choices.

Per replica, a sorted set `switchyard:replica:<id>:dispatched` holds request ids scored by when
the entry expires (Redis' clock, so web processes' clocks need not agree). The web process that
dispatched a request removes its entry when the request ends in any way (finished, failed,
aborted by the client, its replica gone) and pushes the expiry of its open requests forward
every REFRESH_SECONDS; the entries of a web process that died expire within TTL_SECONDS.
"""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis

log = logging.getLogger(__name__)
TTL_SECONDS = 30
REFRESH_SECONDS = 10

# KEYS: the candidates' sets. ARGV: request id, ttl, then per candidate its reported load and
# free KV blocks. Drops expired entries, picks the lowest max(reported, dispatched) (ties: most
# free KV blocks, then the first candidate), adds the request to it. Returns the index (0-based)
# and the cost.
_PICK = """
local now = redis.call('TIME')
now = tonumber(now[1]) + tonumber(now[2]) / 1000000
local best, best_cost, best_free
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local cost = math.max(tonumber(ARGV[1 + 2 * i]), redis.call('ZCARD', key))
  local free = tonumber(ARGV[2 + 2 * i])
  if best == nil or cost < best_cost or (cost == best_cost and free > best_free) then
    best, best_cost, best_free = i, cost, free
  end
end
redis.call('ZADD', KEYS[best], now + tonumber(ARGV[2]), ARGV[1])
return {best - 1, best_cost}
"""

# KEYS[1]: one replica's set. ARGV: ttl, then request ids still open: their expiry moves on
# (XX: an entry removed meanwhile is not brought back).
_REFRESH = """
local now = redis.call('TIME')
local expiry = tonumber(now[1]) + tonumber(now[2]) / 1000000 + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[i])
end
return #ARGV - 1
"""


def dispatched_key(replica_id: int) -> str:
    return f"switchyard:replica:{replica_id}:dispatched"


class Dispatched:
    """One web process's side of the count: what it has open, and the Redis calls."""

    def __init__(self, client: aioredis.Redis, ttl: float = TTL_SECONDS):
        self.redis = client
        self.ttl = ttl
        self.open: dict[str, int] = {}  # request id -> replica id
        self._pick = client.register_script(_PICK)
        self._refresh = client.register_script(_REFRESH)

    async def pick(self, request_id: str, candidates: list[tuple[int, int, int]]) -> tuple[int, int]:
        """Choose among (replica id, reported load, free KV blocks) and count the request
        against the one chosen; returns (replica id, its cost before this request)."""
        keys = [dispatched_key(rid) for rid, _, _ in candidates]
        args = [request_id, self.ttl, *(v for _, load, free in candidates for v in (load, free))]
        index, cost = await self._pick(keys=keys, args=args)
        rid = candidates[int(index)][0]
        self.open[request_id] = rid
        return rid, int(cost)

    async def done(self, request_id: str) -> None:
        """The request ended (any way): it no longer counts. Safe to call more than once."""
        rid = self.open.pop(request_id, None)  # first: if Redis fails now, the entry just expires
        if rid is not None:
            await self.redis.zrem(dispatched_key(rid), request_id)

    async def refresh(self) -> None:
        by_replica: dict[int, list[str]] = {}
        for request_id, rid in list(self.open.items()):
            by_replica.setdefault(rid, []).append(request_id)
        for rid, ids in by_replica.items():
            await self._refresh(keys=[dispatched_key(rid)], args=[self.ttl, *ids])

    async def keep_fresh(self, interval: float = REFRESH_SECONDS) -> None:
        """Run for the life of the web process: its open requests never expire under it."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.refresh()
            except aioredis.RedisError:  # Redis away for a moment: the next round catches up
                log.warning("could not refresh the dispatched requests' expiry", exc_info=True)
