"""The gateway's count of requests in flight per replica, on the real Redis: concurrent pickers
(in different web processes) spread, an ended request stops counting, and a web process that
dies cannot leave its requests counted for more than the expiry."""

import asyncio
import math
import random
from collections import Counter
from types import SimpleNamespace

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import ConnectionError as RedisConnectionError

from controlplane.gateway import generation
from controlplane.gateway.routing import policies, router
from controlplane.gateway.routing.dispatched import (
    Dispatched,
    dispatched_key,
    recent_key,
    session_recent_key,
    sessions_key,
)
from workers.protocol.replica import GenerateMessage

pytestmark = pytest.mark.asyncio
A, B = 990001, 990002  # replica ids no other test uses


@pytest_asyncio.fixture
async def client():
    c = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    await c.delete(dispatched_key(A), dispatched_key(B))
    yield c
    await c.delete(dispatched_key(A), dispatched_key(B))
    await c.aclose()


IDLE = [(A, 0, 100), (B, 0, 100)]


async def pick(web: Dispatched, request_id: str, candidates) -> tuple[int, int]:
    """Least loaded among (replica id, reported load, free KV blocks): (chosen, its load before)."""
    plan = policies.plan(policies.LEAST_LOADED, [policies.Candidate(*c) for c in candidates])
    chosen = await web.pick(request_id, plan)
    return chosen.replica_id, chosen.loads[[c[0] for c in candidates].index(chosen.replica_id)]


async def test_concurrent_pickers_in_two_web_processes_spread_a_burst(client):
    web1, web2 = Dispatched(client), Dispatched(aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True))
    picks = await asyncio.gather(*(pick(web, f"r{i}", IDLE) for i, web in enumerate([web1, web2] * 4)))
    assert Counter(rid for rid, _ in picks) == {A: 4, B: 4}
    assert await client.zcard(dispatched_key(A)) == await client.zcard(dispatched_key(B)) == 4
    await web2.redis.aclose()


async def test_the_cost_is_the_larger_of_reported_and_dispatched_then_free_kv_blocks(client):
    web = Dispatched(client)
    busy = [(A, 3, 100), (B, 0, 100)]  # A reports 3 requests this gateway did not send
    assert [(await pick(web, f"r{i}", busy))[0] for i in range(3)] == [B, B, B]
    assert (await pick(web, "r3", busy)) == (A, 3)  # 3 against 3: a tie, the first candidate
    report = [(A, 0, 10), (B, 0, 50)]  # a heartbeat that has not seen any of them yet
    assert [(await pick(web, f"r{i}", report))[0] for i in (4, 5)] == [A, A]  # A: 1, 2 against B: 3
    assert (await pick(web, "r6", report)) == (B, 3)  # 3 against 3: B has more free KV blocks
    assert (await pick(web, "r7", [(A, 9, 10), (B, 0, 50)])) == (B, 4)


async def test_an_ended_request_stops_counting(client):
    web = Dispatched(client)
    rid, _ = await pick(web, "r1", IDLE)
    assert await client.zcard(dispatched_key(rid)) == 1
    await web.done("r1")
    await web.done("r1")  # twice: harmless
    assert await client.zcard(dispatched_key(rid)) == 0 and web.open == {}
    assert (await pick(web, "r2", IDLE)) == (A, 0)


async def test_a_dead_web_process_leaves_nothing_counted_past_the_expiry(client):
    dead = Dispatched(client, ttl=0)  # its entries expire at once, as they would TTL later
    for i in range(3):
        assert (await pick(dead, f"r{i}", IDLE)) == (A, 0)  # an expired entry no longer counts
    alive = Dispatched(client, ttl=0)
    await pick(alive, "kept", IDLE)
    alive.ttl = 30
    await alive.refresh()  # a live process pushes its open requests' expiry forward
    assert (await pick(alive, "next", IDLE))[0] == B
    await alive.done("kept")
    await alive.refresh()  # and does not bring back one that ended
    assert await client.zscore(dispatched_key(A), "kept") is None


async def test_a_request_that_fails_between_its_pick_and_its_sending_stops_counting(client, monkeypatch):
    """The router counts the request, then may still fail (the session-affinity write, the
    prefill replicas' statuses, a client that goes away): nothing was sent, nothing counts."""
    web = Dispatched(client)

    async def choose(hub, deployment, candidates, request_id, *args):
        await pick(hub.dispatched, request_id, IDLE)
        raise RedisConnectionError("gone after the pick")

    monkeypatch.setattr(router, "choose", choose)
    with pytest.raises(RedisConnectionError):
        await generation._place(
            SimpleNamespace(dispatched=web),
            SimpleNamespace(slug="d"),
            {"decode": [A, B], "prefill": []},
            GenerateMessage(),
            lambda: "r1",
        )
    assert web.open == {} and await client.zcard(dispatched_key(A)) == 0


# -- the routing rule in Lua, against its Python reference, and sessions bound in Redis ----------
RIDS = [990011, 990012, 990013, 990014]


@pytest_asyncio.fixture
async def sessions(client):
    keys = [dispatched_key(r) for r in RIDS] + [sessions_key(r) for r in RIDS] + [recent_key(r) for r in RIDS]

    async def clear() -> None:  # before too: a run that died left its keys
        await client.delete(*keys)
        for pattern in ("switchyard:affinity:test-dispatched:*", "switchyard:affinity-recent:test-dispatched:*"):
            async for key in client.scan_iter(pattern):
                await client.delete(key)

    await clear()
    yield client
    await clear()


async def test_the_lua_pick_agrees_with_routing_pick_on_random_inputs(sessions):
    rng = random.Random(3)
    web = Dispatched(sessions)
    fresh = moved = 0
    for trial in range(150):
        n = rng.randrange(1, 5)
        cands = [
            policies.Candidate(RIDS[i], rng.randrange(0, 9), rng.randrange(0, 4), rng.randrange(0, 40))
            for i in range(n)
        ]
        dispatched = [rng.randrange(0, 12) for _ in range(n)]
        for c, count in zip(cands, dispatched, strict=True):
            await sessions.delete(dispatched_key(c.replica_id))
            if count:
                await sessions.zadd(dispatched_key(c.replica_id), {f"x{j}": 1e12 for j in range(count)})
        policy = rng.choice(policies.POLICIES)
        session = rng.choice([None, f"s{trial}"])
        bound = rng.choice([None, *(c.replica_id for c in cands)])
        plan = policies.plan(policy, cands, session=session, bound_to=bound, prompt_blocks=rng.randrange(0, 60),
                            turn=rng.randrange(0, 7), load_factor=rng.choice([1.0, 1.25, 2.0]),
                            shared_blocks=rng.choice([0, max(c.cached_blocks for c in cands)]))  # fmt: skip
        key, own = None, 0
        if plan.session is not None:
            key = f"switchyard:affinity:test-dispatched:{trial}"
            if bound is not None:
                await sessions.set(key, bound)
            own = rng.randrange(0, 8)  # the session's own requests lately
            if own:
                await sessions.zadd(session_recent_key(key), {f"mine{j}": 1e12 for j in range(own)})
        own_key = None
        if plan.session is None and plan.recent:  # a keyless conversation's own requests
            own_key, own = f"switchyard:affinity:test-dispatched:conv{trial}", rng.randrange(0, 8)
            if own:
                await sessions.zadd(own_key, {f"mine{j}": 1e12 for j in range(own)})
        bindings = {c.replica_id: rng.randrange(0, 6) for c in cands}  # other sessions bound to each
        for rid, count in bindings.items():
            await sessions.delete(sessions_key(rid))
            if count:
                await sessions.zadd(sessions_key(rid), {f"other{j}": 1e12 for j in range(count)})
        sent = {c.replica_id: rng.randrange(0, 20) for c in cands}  # requests sent to each lately
        for rid, count in sent.items():
            await sessions.delete(recent_key(rid))
            if count:
                await sessions.zadd(recent_key(rid), {f"old{j}": 1e12 for j in range(count)})
        counts = dict(zip((c.replica_id for c in cands), dispatched, strict=True))
        dispatched = [counts[c.replica_id] for c in plan.candidates]  # in the plan's order (a ring's)
        bound_counts = [bindings[c.replica_id] for c in plan.candidates]
        recent = [sent[c.replica_id] for c in plan.candidates]
        fresh += plan.fresh
        natural = min(range(len(plan.candidates)), key=lambda i: (plan.base[i], i))  # a keyless turn's home
        home = [c.replica_id for c in plan.candidates].index(bound) if plan.session and bound in sent else natural
        moved += plan.rebalance and policies._sent_too_many(home, recent, dispatched, math.inf, own, plan.load_factor)
        expected = plan.candidates[
            policies.pick(plan, dispatched, bound_to=bound, sessions=bound_counts, recent=recent, own=own)
        ].replica_id
        chosen = await web.pick(f"t{trial}", plan, key, 60, own_key=own_key)
        assert chosen.replica_id == expected, (plan, dispatched, bound, recent, own)
        assert chosen.loads == [max(c.reported_load, d) for c, d in zip(plan.candidates, dispatched, strict=True)]
        if key is not None:
            assert int(await sessions.get(key)) == chosen.replica_id  # bound (or rebound) to the pick
            for c in cands:  # ... and counted in that replica's sessions alone
                held = await sessions.zscore(sessions_key(c.replica_id), key) is not None
                assert held == (c.replica_id == chosen.replica_id)
        for c in cands:  # a KV-aware or session plan counts the request among its replica's recent ones
            counted = await sessions.zscore(recent_key(c.replica_id), f"t{trial}") is not None
            assert counted == (plan.recent and c.replica_id == chosen.replica_id)
        if key is not None:  # ... and among its session's
            assert (await sessions.zscore(session_recent_key(key), f"t{trial}") is not None) == plan.recent
        await web.done(f"t{trial}")
    assert fresh > 5  # new keyless conversations were among the plans
    assert moved > 3  # ... and bound sessions or continued keyless turns sent elsewhere


def session_plan(key: str, ids=RIDS) -> policies.Plan:
    return policies.plan(policies.SESSION, [policies.Candidate(r, 0, 100) for r in ids], session=key)


async def test_concurrent_first_requests_of_one_session_in_two_web_processes_agree(sessions):
    """Four at once (MIN_LOAD_CAP: below it no replica is over the bound; a bigger burst of one
    key spills to the next replica, as bounded loads mean it to)."""
    other = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    web1, web2 = Dispatched(sessions), Dispatched(other)
    for s in range(20):
        key = f"switchyard:affinity:test-dispatched:fork{s}"
        # differing plans (as each process saw different loads): the binding still decides
        plans = [session_plan(f"fork{s}"), policies.plan(
            policies.SESSION_KV_AWARE, [policies.Candidate(r, 0, 100, 30 * (r == RIDS[s % 4])) for r in RIDS],
            session=f"fork{s}", prompt_blocks=30)]  # fmt: skip
        picks = await asyncio.gather(
            *(web.pick(f"f{s}-{i}", plans[i % 2], key, 60) for i, web in enumerate([web1, web2] * 2))
        )
        assert len({p.replica_id for p in picks}) == 1, picks
        for i, web in enumerate([web1, web2] * 2):
            await web.done(f"f{s}-{i}")
    await other.aclose()


async def test_1000_sessions_share_four_replicas_within_the_bound_and_a_removed_replica_moves_only_its_own(sessions):
    web = Dispatched(sessions)
    bound: dict[str, int] = {}
    for s in range(1000):  # sessions that stay open: each one's request keeps counting
        key = f"switchyard:affinity:test-dispatched:u{s}"
        bound[key] = (await web.pick(f"u{s}", session_plan(f"u{s}"), key, 60)).replica_id
    shares = Counter(bound.values())
    assert sum(shares.values()) == 1000 and max(shares.values()) <= math.ceil(1.25 * 1000 / 4)
    for s in range(1000):
        await web.done(f"u{s}")
    gone = RIDS[2]
    for s in range(1000):  # the same sessions' next turns, one replica fewer
        key = f"switchyard:affinity:test-dispatched:u{s}"
        now = (await web.pick(f"v{s}", session_plan(f"u{s}", [r for r in RIDS if r != gone]), key, 60)).replica_id
        await web.done(f"v{s}")
        assert now == bound[key] if bound[key] != gone else now != gone


async def test_new_sessions_spread_by_the_sessions_each_replica_holds(sessions):
    """Idle replicas (nothing in flight, so the load bound never binds): 28 sessions, as many
    as the cache benchmark's trace has, end up 7 a replica within the session bound, where ring
    order alone gave one replica twice another's share; a bound session's turns stay put."""
    web = Dispatched(sessions)
    where = {}
    for s in range(28):
        key = f"switchyard:affinity:test-dispatched:even{s}"
        where[key] = (await web.pick(f"e{s}", session_plan(f"even{s}"), key, 60)).replica_id
        await web.done(f"e{s}")
    shares = Counter(where.values())
    assert max(shares.values()) <= math.ceil(1.25 * 28 / 4), shares
    assert [await sessions.zcard(sessions_key(r)) for r in RIDS] == [shares[r] for r in RIDS]
    for key, rid in where.items():  # next turns: the binding holds whatever the counts
        s = key.rsplit("even", 1)[1]
        assert (await web.pick(f"n{s}", session_plan(f"even{s}"), key, 60)).replica_id == rid
        await web.done(f"n{s}")


async def test_a_bound_session_moves_off_a_replica_sent_its_share_twice_over_unless_it_is_alone(sessions):
    """Two busy sessions bound to one replica (12 requests each in the last minute), the others
    idle: the next turn of one moves to the least-sent replica and is bound there; a lone busy
    session stays, since moving it would only carry its requests along."""
    web = Dispatched(sessions)
    home = RIDS[0]

    async def busy(key: str, rid: int, n: int) -> None:
        await sessions.set(key, rid)
        await sessions.zadd(sessions_key(rid), {key: 1e12})
        stamps = {f"{key}-{j}": 1e12 for j in range(n)}
        await sessions.zadd(recent_key(rid), stamps)
        await sessions.zadd(session_recent_key(key), stamps)

    a, b = "switchyard:affinity:test-dispatched:busy-a", "switchyard:affinity:test-dispatched:busy-b"
    await busy(a, home, 12)
    await busy(b, home, 12)
    await sessions.zadd(recent_key(RIDS[2]), {"other": 1e12})  # RIDS[1] and RIDS[3] idle
    moved = await web.pick("m1", session_plan("busy-a"), a, 60)
    assert not moved.kept_binding and moved.replica_id in (RIDS[1], RIDS[3])
    assert int(await sessions.get(a)) == moved.replica_id
    assert await sessions.zscore(sessions_key(home), a) is None
    assert await sessions.zscore(sessions_key(moved.replica_id), a) is not None
    await web.done("m1")
    # a replica with one busy session alone, on a fleet otherwise as idle
    for rid in RIDS:
        await sessions.delete(recent_key(rid), sessions_key(rid))
    lone = "switchyard:affinity:test-dispatched:busy-lone"
    await busy(lone, home, 24)
    stays = await web.pick("m2", session_plan("busy-lone"), lone, 60)
    assert stays.kept_binding and stays.replica_id == home
    await web.done("m2")


async def test_new_keyless_conversations_spread_by_the_requests_each_replica_was_sent(sessions):
    """The cache benchmark's kv_aware pile-up: one replica holds the shared system prompt (40
    blocks), so without the rule every new conversation's first turn goes there (40 blocks
    cheaper than anywhere else, all idle). With it each goes where the fewest requests went, and
    a continued conversation's turn (its match past the shared prefix) still goes to its prefix
    unless other conversations sent that replica over its share (policies.pick's rebalancing)."""
    web = Dispatched(sessions)
    home = RIDS[0]

    def first_turn(shared: int) -> policies.Plan:
        cands = [policies.Candidate(r, 0, 100, 40 if r == home else 0) for r in RIDS]
        return policies.plan(policies.KV_AWARE, cands, prompt_blocks=60, shared_blocks=shared)

    where = []
    for s in range(28):
        where.append((await web.pick(f"k{s}", first_turn(40), None, 60)).replica_id)
        await web.done(f"k{s}")
    shares = Counter(where)
    assert shares == dict.fromkeys(RIDS, 7), shares
    assert [await sessions.zcard(recent_key(r)) for r in RIDS] == [7] * 4
    # without the shared-prefix count (shared_blocks 0) the prompt looks continued: on home, while
    # home is under its share of recent requests (10 of 31: a fourth would move, see policies.pick)
    for s in range(3):
        assert (await web.pick(f"c{s}", first_turn(0), None, 60)).replica_id == home
        await web.done(f"c{s}")
    # a continued turn: its own context (55 blocks) is only on the busiest replica (sent 10 of 31);
    # it stays there while its own conversation brought much of that (moving it would carry it along)
    busiest = shares.most_common(1)[0][0]
    cands = [policies.Candidate(r, 0, 100, 55 if r == busiest else 40 * (r == home)) for r in RIDS]
    turn = policies.plan(policies.KV_AWARE, cands, prompt_blocks=60, shared_blocks=0)
    mine = "switchyard:affinity:test-dispatched:conversation"
    await sessions.zadd(mine, {f"mine{j}": 1e12 for j in range(6)})
    stays = await web.pick("turn", turn, None, 60, own_key=mine)
    assert not turn.fresh and stays.replica_id == busiest and not stays.rebalanced
    await web.done("turn")
    # ... but leaves for the least-sent replica when other conversations brought it
    other = "switchyard:affinity:test-dispatched:other-conversation"
    leaves = await web.pick("turn2", turn, None, 60, own_key=other)
    assert leaves.replica_id != busiest and leaves.rebalanced
    await web.done("turn2")


async def test_a_session_named_like_another_sessions_recent_set_does_not_collide(sessions):
    """Session keys are any client string: "k:recent" must not be session "k"'s recent set (a
    string and a sorted set under one key would fail every pick of both)."""
    web = Dispatched(sessions)
    for name in ("clash", "clash:recent"):
        key = f"switchyard:affinity:test-dispatched:{name}"
        for turn in range(2):
            picked = await web.pick(f"{name}-{turn}", session_plan(name), key, 60)
            assert picked.replica_id in RIDS
            await web.done(f"{name}-{turn}")
    assert await sessions.type("switchyard:affinity:test-dispatched:clash:recent") == "string"  # a binding
    assert await sessions.zcard(session_recent_key("switchyard:affinity:test-dispatched:clash")) == 2


async def test_keyless_conversation_beginnings_expire_and_are_trimmed(client):
    """router._conversation: a new keyless conversation registers the block it began at for the
    session TTL; a later prompt holding it belongs to it; once expired it matches nothing and the
    next registration trims it (the set does not grow with every one-shot prompt)."""
    from types import SimpleNamespace

    from controlplane.gateway.routing.router import Settings, _conversation, conversations_key

    slug, hub, cfg = "test-conversations", SimpleNamespace(redis=client), Settings(session_ttl=60)
    await client.delete(conversations_key(slug))
    cands = [policies.Candidate(r, 0, 100, 2 if r == RIDS[0] else 0) for r in RIDS]
    new = policies.plan(policies.KV_AWARE, cands, prompt_blocks=4, shared_blocks=2)  # past a shared prefix
    assert new.fresh and await _conversation(hub, cfg, slug, new, [1, 2, 3, 4], {RIDS[0]: 2}) == 3
    held = [policies.Candidate(r, 0, 100, 4 if r == RIDS[1] else 0) for r in RIDS]
    turn = policies.plan(policies.KV_AWARE, held, prompt_blocks=6, shared_blocks=0)
    assert turn.rebalance and await _conversation(hub, cfg, slug, turn, [1, 2, 3, 4, 5, 6], {RIDS[1]: 4}) == 3
    await client.zadd(conversations_key(slug), {"3": 1.0})  # its TTL passed
    assert await _conversation(hub, cfg, slug, turn, [1, 2, 3, 4, 5, 6], {RIDS[1]: 4}) is None
    assert await _conversation(hub, cfg, slug, new, [1, 2, 9, 4], {RIDS[0]: 2}) == 9
    assert await client.zrange(conversations_key(slug), 0, -1) == ["9"]
    assert 0 < await client.ttl(conversations_key(slug)) <= 60
    await client.delete(conversations_key(slug))
