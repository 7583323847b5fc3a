"""Requests the gateway has sent to each replica and not yet seen end, counted in Redis so that
every web process sees every other's.

A replica's heartbeat reports its load every 0.5 s, so a burst that arrives within one
heartbeat sees every replica idle and, routed on the heartbeat alone, lands on one of them. The
router therefore picks on `max(reported, dispatched)`: each is a lower bound of what the replica
has to do (the report lags; the count misses work that did not come through a gateway), and
the pick, the increment and a session's (re)binding happen in one Lua script (the rule is
`policies.pick`), so concurrent pickers in any number of web processes see each other's choices
and concurrent first requests of one session agree on its replica.

Per replica, a sorted set `switchyard:replica:<id>:dispatched` holds request ids scored by when
the entry expires (Redis' clock, so web processes' clocks need not agree). The web process that
dispatched a request removes its entry when the request ends in any way (finished, failed,
aborted by the client, its replica gone) and pushes the expiry of its open requests forward
every REFRESH_SECONDS; the entries of a web process that died expire within TTL_SECONDS. A
sorted set `switchyard:replica:<id>:sessions` holds the session keys bound to the replica,
scored by when each binding expires (the session bound of `policies.pick`), and
`switchyard:replica:<id>:recent` the requests a KV-aware or session policy sent it, each for
`routing.RECENT_SECONDS` (where new conversations go, and when a bound session moves), and
`switchyard:affinity-recent:<deployment>:<key>` a session key's own.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import redis.asyncio as aioredis

from controlplane.gateway.routing import policies
from controlplane.gateway.routing.policies import Plan

log = logging.getLogger(__name__)
TTL_SECONDS = 30
REFRESH_SECONDS = 10

# The atomic step of `policies.pick` (keep the two in step: tests compare them). KEYS: the
# candidates' dispatched sets, then, if ARGV[5] is 1, the candidates' session sets and the
# session's affinity key, then, if ARGV[8] is not 0, the candidates' recent sets, then, if ARGV[11]
# is 1, the recent set of the request's own session or keyless conversation. ARGV: request id,
# ttl, load weight, load factor (0: no bound), has affinity, affinity ttl, the minimum cap, recent
# (0: not counted, 1: counted, 2: counted and first: placed anew), the recent window, the minimum
# recent cap (0: no rebalancing: neither a bound session nor a keyless turn moves for its
# replica's recent requests), has an own set, then per candidate its replica id, reported load,
# free KV blocks and base cost.
# Drops expired entries; a bound session's replica wins while under the load cap and not sent
# too many lately (`policies._sent_too_many`), else the lowest base + weight * load among those
# under the load cap (a session placed anew: and under the session cap, unless none is; placed
# anew, or a keyless turn whose cheapest replica was sent too many: the fewest recent requests
# first; ties: most free KV blocks, then the first); adds the request to it (and to its and the
# own recent sets) and (re)binds the session, moving it between session sets. Returns {index
# (0-based), 1 if the binding was kept, 1 if a continued keyless turn was sent where the fewest
# requests went, the candidates' loads...}.
_PICK = """
local now = redis.call('TIME')
now = tonumber(now[1]) + tonumber(now[2]) / 1000000
local has_affinity = ARGV[5] == '1'
local recent_mode = tonumber(ARGV[8])
local window = tonumber(ARGV[9])
local has_own = ARGV[11] == '1'
local extra = 0
if has_affinity then extra = extra + 1 end
if has_own then extra = extra + 1 end
local sets = 1
if has_affinity then sets = sets + 1 end
if recent_mode > 0 then sets = sets + 1 end
local n = (#KEYS - extra) / sets
local rbase = n
if has_affinity then rbase = 2 * n + 1 end
local own_key = nil
if has_own then own_key = KEYS[#KEYS] end
local loads, total = {}, 0
for i = 1, n do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  loads[i] = math.max(tonumber(ARGV[9 + 4 * i]), redis.call('ZCARD', KEYS[i]))
  total = total + loads[i]
end
local factor = tonumber(ARGV[4])
local cap = math.huge
if factor > 0 then cap = math.max(math.ceil(factor * (total + 1) / n), tonumber(ARGV[7])) end
local function share_cap(counts)
  if factor <= 0 then return math.huge end
  local sum = 0
  for i = 1, n do sum = sum + counts[i] end
  return math.ceil(factor * (sum + 1) / n)
end
local sent, own = {}, 0
for i = 1, n do sent[i] = 0 end
if recent_mode > 0 then
  for i = 1, n do
    redis.call('ZREMRANGEBYSCORE', KEYS[rbase + i], '-inf', now)
    sent[i] = redis.call('ZCARD', KEYS[rbase + i])
  end
  if own_key ~= nil then
    redis.call('ZREMRANGEBYSCORE', own_key, '-inf', now)
    own = redis.call('ZCARD', own_key)
  end
end
local function sent_too_many(b)
  if ARGV[10] == '0' then return false end
  if sent[b] < math.max(share_cap(sent), tonumber(ARGV[10])) then return false end
  local least = nil
  for j = 1, n do
    if j ~= b and loads[j] < cap and (least == nil or sent[j] < least) then least = sent[j] end
  end
  return least ~= nil and least + own < sent[b]
end
local best, kept, bound = nil, 0, nil
local counted, ccap = nil, math.huge
if has_affinity then
  bound = redis.call('GET', KEYS[2 * n + 1])
  for i = 1, n do
    if bound == ARGV[8 + 4 * i] and loads[i] < cap and not sent_too_many(i) then best, kept = i, 1 end
  end
  counted = {}
  for i = 1, n do
    redis.call('ZREMRANGEBYSCORE', KEYS[n + i], '-inf', now)
    counted[i] = redis.call('ZCARD', KEYS[n + i])
  end
  ccap = share_cap(counted)
end
local spread = recent_mode == 2
if not has_affinity and recent_mode == 1 and ARGV[10] ~= '0' then
  local home = 1  -- a continued keyless turn's home: the cheapest replica
  for i = 2, n do
    if tonumber(ARGV[11 + 4 * i]) < tonumber(ARGV[11 + 4 * home]) then home = i end
  end
  spread = sent_too_many(home)
end
local function cheapest(use_ccap)
  local weight, choice, best_first, best_cost, best_free = tonumber(ARGV[3]), nil, nil, nil, nil
  for i = 1, n do
    if loads[i] < cap and (not use_ccap or counted[i] < ccap) then
      local first = 0
      if spread then first = sent[i] end
      local cost = tonumber(ARGV[11 + 4 * i]) + weight * loads[i]
      local free = tonumber(ARGV[10 + 4 * i])
      if choice == nil or first < best_first or (first == best_first and (cost < best_cost
          or (cost == best_cost and free > best_free))) then
        choice, best_first, best_cost, best_free = i, first, cost, free
      end
    end
  end
  return choice
end
if best == nil then
  if counted ~= nil then best = cheapest(true) end
  if best == nil then best = cheapest(false) end
end
redis.call('ZADD', KEYS[best], now + tonumber(ARGV[2]), ARGV[1])
if recent_mode > 0 then
  redis.call('ZADD', KEYS[rbase + best], now + window, ARGV[1])
  redis.call('EXPIRE', KEYS[rbase + best], math.ceil(window))
  if own_key ~= nil then
    redis.call('ZADD', own_key, now + window, ARGV[1])
    redis.call('EXPIRE', own_key, math.ceil(window))
  end
end
if has_affinity then
  local chosen = ARGV[8 + 4 * best]
  redis.call('SET', KEYS[2 * n + 1], chosen, 'EX', ARGV[6])
  for i = 1, n do
    if i ~= best and bound == ARGV[8 + 4 * i] then redis.call('ZREM', KEYS[n + i], KEYS[2 * n + 1]) end
  end
  redis.call('ZADD', KEYS[n + best], now + tonumber(ARGV[6]), KEYS[2 * n + 1])
  redis.call('EXPIRE', KEYS[n + best], ARGV[6])
end
local spread_flag = 0
if spread and not has_affinity and recent_mode == 1 then spread_flag = 1 end
local out = {best - 1, kept, spread_flag}
for i = 1, n do out[i + 3] = loads[i] end
return out
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


@dataclass
class Pick:
    replica_id: int
    loads: list[int]  # each candidate's load as the pick saw it (before this request)
    kept_binding: bool  # the session's bound replica was chosen
    rebalanced: bool = False  # a continued keyless turn left its replica, sent over its share lately


def dispatched_key(replica_id: int) -> str:
    return f"switchyard:replica:{replica_id}:dispatched"


def sessions_key(replica_id: int) -> str:
    """The session keys bound to a replica, scored by when each binding expires."""
    return f"switchyard:replica:{replica_id}:sessions"


def recent_key(replica_id: int) -> str:
    """The requests a KV-aware policy sent a replica, scored by when each stops counting."""
    return f"switchyard:replica:{replica_id}:recent"


def session_recent_key(affinity_key: str) -> str:
    """The requests of one session key routed in the last `routing.RECENT_SECONDS` (its own share
    of its replica's recent ones). A prefix of its own, not a suffix of the affinity key: a
    session named "k:recent" must not land on session "k"'s set."""
    return "switchyard:affinity-recent:" + affinity_key.removeprefix("switchyard:affinity:")


class Dispatched:
    """One web process's side of the count: what it has open, and the Redis calls."""

    def __init__(self, client: aioredis.Redis, ttl: float = TTL_SECONDS):
        self.redis = client
        self.ttl = ttl
        self.open: dict[str, int] = {}  # request id -> replica id
        self._pick = client.register_script(_PICK)
        self._refresh = client.register_script(_REFRESH)

    async def pick(
        self, request_id: str, plan: Plan, affinity_key: str | None = None, ttl: int = 0, own_key: str | None = None
    ) -> Pick:
        """Choose by `plan` (policies.py's rule, in one atomic step) and count the request against
        the replica chosen; with `affinity_key`, honour and (re)bind the plan's session. `own_key`:
        the recent set of the request's keyless conversation (`router.conversation_recent_key`);
        a session's is its affinity key's."""
        keys = [dispatched_key(c.replica_id) for c in plan.candidates]
        if affinity_key is not None:
            keys += [sessions_key(c.replica_id) for c in plan.candidates]
            keys.append(affinity_key)
        if plan.recent:
            keys += [recent_key(c.replica_id) for c in plan.candidates]
            if affinity_key is not None:
                own_key = session_recent_key(affinity_key)
            if own_key is not None:
                keys.append(own_key)
        else:
            own_key = None
        recent = (2 if plan.fresh else 1) if plan.recent else 0
        rebalance = policies.MIN_RECENT_CAP if plan.rebalance else 0
        args = [
            request_id,
            self.ttl,
            plan.weight,
            plan.load_factor,
            int(affinity_key is not None),
            max(ttl, 1),
            policies.MIN_LOAD_CAP,
            recent,
            policies.RECENT_SECONDS,
            rebalance,
            int(own_key is not None),
        ]
        for c, base in zip(plan.candidates, plan.base, strict=True):
            args += [c.replica_id, c.reported_load, c.free_blocks, base]
        index, kept, spread, *loads = await self._pick(keys=keys, args=args)
        chosen = plan.candidates[int(index)]
        self.open[request_id] = chosen.replica_id
        return Pick(chosen.replica_id, [int(x) for x in loads], bool(kept), bool(spread))

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
