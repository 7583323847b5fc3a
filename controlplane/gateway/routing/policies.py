"""Routing policies: which ready replica should serve a request, as pure functions.

Nothing here reads the database, Redis or HTTP: `router.py` gathers the facts (ready replicas,
their load, the blocks of the prompt each one holds, a session's binding) and this module turns
them into a `Plan`. The last step, choosing among the candidates by their load and counting the
request against the one chosen, must be atomic across web processes, so it runs in Redis
(`dispatched.py`); `pick` below is that step's rule in Python, the reference the Lua script is
tested against.

The rule. Each candidate has a static `base` cost from the policy and a `load` (requests in
flight: the larger of what its heartbeat reports and what the gateways have sent it). With a
load bound c > 0, a candidate is eligible only while load < ⌈c·(Σload + 1)/n⌉ (consistent hashing
with bounded loads, Mirrokni, Thorup & Zadimoghaddam 2016: the +1 is the request being placed;
at least the least-loaded replica always qualifies), and always below MIN_LOAD_CAP. Among the eligible, the lowest
`base + weight·load` wins; ties go to the most free KV blocks, then to the first candidate. A
session's binding, when its replica is eligible, wins outright.

Placing a session key anew (unbound, or moved off a replica over the bound), the same bound
applies to the sessions each replica holds: a replica is eligible for the key only while its
live bindings are under ⌈c·(Σsessions + 1)/n⌉ (the least-bound replica always qualifies; if no
replica is under both bounds, the load bound alone decides). The load bound alone almost never
moves a key: with think times between turns a replica rarely has MIN_LOAD_CAP requests in
flight, so where 28 sessions of 8-30 turns hashed decided the load (the cache benchmark's
`session` policy had 1.55x the mean requests on one replica). Bound keys never move for it.

Sessions differ in size by more than their count can balance (the benchmark's keys send 9 to 41
requests: a forking agent's sub-agents carry its key), so a key also answers for the requests its
replica was sent lately (each replica's last RECENT_SECONDS, and each key's own, in Redis):
- placed anew, it goes among the eligible replicas to the one sent the fewest lately, then in
  ring order (on an idle fleet: the ring's first);
- bound (`session` policy), it moves when its replica was sent at least ⌈c·(Σrecent + 1)/n⌉ (and
  MIN_RECENT_CAP) and the move helps: the least-sent other replica under the load bound, given
  this key's own recent requests, would still stay under what its replica has now. A lone busy
  session never moves (it would only carry its load along); of two busy sessions sharing a
  replica while another idles, one moves. Simulated on the benchmark's trace (20 seeds, three
  service speeds): max/mean requests per replica 1.13 on average, at most 1.22, against 1.34 and
  1.83 for placement alone, at 0.6 points of hit rate (about 5 moves a run). `session+kv_aware`
  keeps a bound key where its prefix is (the load bound alone moves it): there keyless traffic
  counts among the recent requests too, and a session's turns would leave their cache to make
  room for requests that are not its neighbours'.

Without a key (`kv_aware`) there is nothing to count conversations by, and a conversation's first
turn went wherever the shared system prompt was cheapest: whole conversations piled on one
replica (the benchmark's `kv_aware` had 1.71x the mean requests on one). So the plan tells a new
keyless conversation from a continued one (`Plan.fresh`): a prompt is new when nothing of it is
cached anywhere, or when the longest prefix any replica holds ends at a *shared* block — one
where the cached prefixes of SHARED_PREFIX_PROMPTS earlier prompts already ended (the router
counts, per deployment and block hash, the prompts whose best match ended there;
`shared_prefix`) — and the prompt goes on past it. A continued turn's match ends where its own
previous turn ended, a block no other prompt stopped at; the end of a system prompt that every
conversation starts with is where all first turns stop. A new conversation goes, among the
replicas under the load bound, to the one sent the fewest requests in the last RECENT_SECONDS
(then by cost as usual). Requests rather than conversations, because the earlier first turns
could not all be told apart (the first few conversations on a system prompt look continued
until it is shared), and a replica's recent requests are the load its running conversations
bring. Fewest rather than "under ⌈c·mean⌉ and then the cheapest": a request count lags the
conversations just placed, and the replicas holding the system prompt, cheapest by 40 blocks,
took new conversations up to the cap while one replica got none (simulated on the benchmark's
trace: 1.47x the mean; with the fewest, 1.12x). An identical prompt repeated (nothing past the
shared block) follows its prefix. A continued keyless turn moves under the session rule below:
the router knows its conversation by the block it began at (`router._conversation`), so its own
recent requests are counted as a session key's are, and `Plan.rebalance` is set for it.

The policies (a cache policy's `routing`):
- `round_robin`: the next replica in turn, whatever its load (the baseline of the benchmark).
- `least_loaded`: the lowest load (base 0, weight 1, no bound).
- `session`: the key's replica: the one it is bound to (in Redis, with the policy's TTL), else the
  eligible one sent the fewest requests lately, in ring order; unbound keys and keys whose replica
  left or is over a bound are (re)bound to it. Requests without a key are routed `least_loaded`.
- `kv_aware`: the fewest blocks to prefill plus load, with the bound: base = the prompt's full
  blocks minus those the replica holds (`workers.protocol.kv_blocks`), weight LOAD_BLOCKS, so
  one request in flight costs as much as prefilling LOAD_BLOCKS blocks (Dynamo's
  `w·prefill_blocks + decode_blocks`, with requests standing in for decode blocks). The bound
  keeps a popular prefix from piling every request on one replica; a new conversation goes to
  the replica sent the fewest requests lately (above).
- `session+kv_aware` (the default): a key's binding as in `session`, but an unbound key is placed
  by `kv_aware` rather than by the ring (its prefix may already be somewhere); without a key,
  `kv_aware`.
"""

from __future__ import annotations

import hashlib
import math
from bisect import bisect_left
from dataclasses import dataclass

# The policies' names and defaults (a CachePolicy's choices) live below the gateway.
from controlplane.deployments.routing_policies import (
    DEFAULT_LOAD_FACTOR,
    KV_AWARE,
    LEAST_LOADED,
    POLICIES,
    ROUND_ROBIN,
    SESSION,
    SESSION_KV_AWARE,
)

# One request in flight weighs as much as prefilling this many blocks (256 tokens at 16 a block):
# enough that an idle replica is preferred to one already busy with a short-prefix request, small
# against the hundreds of blocks of a long agent context that a cache hit saves.
LOAD_BLOCKS = 16
# Below this many requests in flight a replica is never over the bound: continuous batching serves
# a few requests nearly as fast as one, and a session that forks sub-agents at once (a burst on
# an idle fleet, where ⌈c·(Σ+1)/n⌉ is 1) must keep them together.
MIN_LOAD_CAP = 4
VIRTUAL_NODES = 64  # points per replica on the ring: shares within a few % of even for 4 replicas
# A block is a shared prefix's end once the cached prefixes of this many earlier prompts ended at
# it. 2, not 1: a parent and one sub-agent forked from its context both stop at the parent's last
# turn, and the parent's next turn must not count as new (one more fork may move it).
SHARED_PREFIX_PROMPTS = 2
# A new keyless conversation goes where the fewest requests were sent this long: about one agent
# conversation (8-30 turns, seconds apart), so it reflects the conversations now running.
RECENT_SECONDS = 60
# Below this many requests in the last RECENT_SECONDS a replica's bound sessions never move for
# them: a handful of turns says nothing about a session's size yet.
MIN_RECENT_CAP = 8


@dataclass(frozen=True)
class Candidate:
    """A ready replica as the router sees it. `cached_blocks`: leading blocks of the prompt it
    holds (0 when unknown)."""

    replica_id: int
    reported_load: int = 0
    free_blocks: int = 0
    cached_blocks: int = 0


@dataclass
class Plan:
    """What the atomic pick needs: candidates in order of preference for ties, their base costs,
    the load weight and bound, and the session binding to honour and keep."""

    candidates: list[Candidate]
    base: list[float]
    weight: float
    load_factor: float  # 0: no bound
    reason: str
    session: str | None = None  # the key to honour and bind to the pick
    recent: bool = False  # count the request in its replica's (and its session's) recent requests
    fresh: bool = False  # placed anew (a keyless new conversation, a session key): fewest recent first
    # A bound session (`session` policy) or a continued keyless conversation (`kv_aware`) leaves
    # its replica when it was sent too many lately and moving helps (`_sent_too_many`).
    rebalance: bool = False


def _point(label: str) -> int:
    return int.from_bytes(hashlib.blake2b(label.encode(), digest_size=8).digest(), "big")


def ring_order(key: str, replica_ids: list[int], vnodes: int = VIRTUAL_NODES) -> list[int]:
    """The replicas in the order met walking a hash ring clockwise from `key`'s point. Each
    replica has `vnodes` points that depend on its id alone, so adding or removing a replica
    changes no other replica's position (only the keys of the one that changed move)."""
    points = sorted((_point(f"replica:{rid}#{i}"), rid) for rid in replica_ids for i in range(vnodes))
    if not points:
        return []
    start = bisect_left(points, (_point(f"key:{key}"), -1))
    order: list[int] = []
    for i in range(len(points)):
        rid = points[(start + i) % len(points)][1]
        if rid not in order:
            order.append(rid)
            if len(order) == len(replica_ids):
                break
    return order


def load_cap(loads: list[int], factor: float) -> float:
    """max(⌈c·(Σload + 1)/n⌉, MIN_LOAD_CAP): the load a replica must stay under to take one more
    request."""
    if factor <= 0 or not loads:
        return math.inf
    return max(math.ceil(factor * (sum(loads) + 1) / len(loads)), MIN_LOAD_CAP)


def session_cap(sessions: list[int], factor: float) -> float:
    """⌈c·(Σsessions + 1)/n⌉: the live session bindings a replica must stay under to take a new
    key (no floor: with a few sessions it spreads them one by one)."""
    if factor <= 0 or not sessions:
        return math.inf
    return math.ceil(factor * (sum(sessions) + 1) / len(sessions))


def recent_cap(recent: list[int], factor: float) -> float:
    """max(⌈c·(Σrecent + 1)/n⌉, MIN_RECENT_CAP): the requests sent lately a bound session's
    replica may have before the session moves (if moving helps: `pick`)."""
    if factor <= 0 or not recent:
        return math.inf
    return max(math.ceil(factor * (sum(recent) + 1) / len(recent)), MIN_RECENT_CAP)


def shared_prefix(best_blocks: int, earlier_prompts: int) -> int:
    """The prompt's leading blocks that many conversations share: the longest cached prefix of it
    (`best_blocks`, on any replica) when the cached prefixes of SHARED_PREFIX_PROMPTS earlier
    prompts ended at that same block (`earlier_prompts`: the router's count), else 0."""
    return best_blocks if earlier_prompts >= SHARED_PREFIX_PROMPTS else 0


def pick(plan: Plan, dispatched: list[int], bound_to: int | None = None, sessions: list[int] | None = None,
         recent: list[int] | None = None, own: int = 0) -> int:  # fmt: skip
    """The index of the candidate the rule chooses, given each one's gateway-dispatched count,
    the replica the plan's session is bound to, each one's live session bindings, its recent
    requests and the session's own recent requests (the reference implementation of the Lua pick
    in `dispatched.py`, which reads the binding and the counts itself in the same atomic step)."""
    loads = [max(c.reported_load, d) for c, d in zip(plan.candidates, dispatched, strict=True)]
    cap = load_cap(loads, plan.load_factor)
    ids = [c.replica_id for c in plan.candidates]
    sent = recent if plan.recent and recent is not None else [0] * len(loads)
    if plan.session is not None and bound_to in ids:
        i = ids.index(bound_to)
        if loads[i] < cap and not (plan.rebalance and _sent_too_many(i, sent, loads, cap, own, plan.load_factor)):
            return i
    eligible = [i for i, load in enumerate(loads) if load < cap]
    if plan.session is not None and sessions is not None:
        scap = session_cap(sessions, plan.load_factor)
        eligible = [i for i in eligible if sessions[i] < scap] or eligible
    fresh = plan.fresh
    if plan.rebalance and plan.session is None:  # a continued keyless turn: its home is the cheapest
        home = min(range(len(loads)), key=lambda i: (plan.base[i], i))
        fresh = _sent_too_many(home, sent, loads, cap, own, plan.load_factor)
    first = sent if fresh else [0] * len(loads)
    return min(
        eligible,
        key=lambda i: (first[i], plan.base[i] + plan.weight * loads[i], -plan.candidates[i].free_blocks, i),
    )


def _sent_too_many(i: int, sent: list[int], loads: list[int], cap: float, own: int, factor: float) -> bool:
    """Whether a bound session leaves candidate `i`: it was sent at least `recent_cap` lately, and
    the least-sent other candidate under the load cap would, with the session's `own` recent
    requests, still be under `i` (else the move would only carry the load along)."""
    if sent[i] < recent_cap(sent, factor):
        return False
    others = [n for j, n in enumerate(sent) if j != i and loads[j] < cap]
    return bool(others) and min(others) + own < sent[i]


def plan(
    policy: str,
    candidates: list[Candidate],
    *,
    session: str | None = None,
    bound_to: int | None = None,
    prompt_blocks: int = 0,
    turn: int = 0,
    load_factor: float = DEFAULT_LOAD_FACTOR,
    shared_blocks: int = 0,
) -> Plan:
    """The plan for one request. `bound_to`: the replica the session key was bound to when the
    caller looked (None if unbound); it decides only the plan's shape, since the pick reads the
    binding again atomically. `prompt_blocks`: the prompt's full blocks the engine could
    reuse (0 when the gateway has no token ids), `turn`: the round-robin counter,
    `shared_blocks`: its leading blocks that many conversations share (`shared_prefix`)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown routing policy {policy!r}")
    n = len(candidates)
    if policy == ROUND_ROBIN:
        start = turn % n if n else 0
        return Plan(candidates, [float((i - start) % n) for i in range(n)], 0.0, 0.0, ROUND_ROBIN)
    by_id = {c.replica_id: c for c in candidates}
    bound = bound_to in by_id
    use_session = policy in (SESSION, SESSION_KV_AWARE) and session is not None
    use_kv = policy in (KV_AWARE, SESSION_KV_AWARE) and prompt_blocks > 0
    if use_session and (bound or policy == SESSION or not use_kv):
        # Consistent hashing with bounded loads: the binding first, then ring order.
        ordered = [by_id[rid] for rid in ring_order(session, list(by_id))]
        reason = "session_bound" if bound else "session_ring"
        return Plan(ordered, [float(i) for i in range(n)], 0.0, load_factor, reason, session, recent=True, fresh=True,
                    rebalance=policy == SESSION)  # fmt: skip
    if use_kv:  # a new (or moved) session key lands where its prefix is, then stays
        held = [min(c.cached_blocks, prompt_blocks) for c in candidates]
        base = [float(prompt_blocks - h) for h in held]
        # Keyless: new when no replica holds more of it than a shared prefix, and it goes on past that.
        fresh = not use_session and max(held) <= min(shared_blocks, prompt_blocks) and max(held) < prompt_blocks
        reason = "session_kv_aware" if use_session else KV_AWARE + (";new_conversation" if fresh else "")
        return Plan(candidates, base, float(LOAD_BLOCKS), load_factor, reason, session if use_session else None,
                    recent=True, fresh=fresh, rebalance=not use_session and not fresh)  # fmt: skip
    reason = LEAST_LOADED
    if policy in (SESSION, SESSION_KV_AWARE) and session is None:
        reason += ";no_session_key"
    elif policy in (KV_AWARE, SESSION_KV_AWARE):
        reason += ";no_token_ids"
    return Plan(candidates, [0.0] * n, 1.0, 0.0, reason)
