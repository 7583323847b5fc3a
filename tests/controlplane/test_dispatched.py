"""The gateway's count of requests in flight per replica, on the real Redis: concurrent pickers
(in different web processes) spread, an ended request stops counting, and a web process that
dies cannot leave its requests counted for more than the expiry."""

import asyncio
from collections import Counter
from types import SimpleNamespace

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import ConnectionError as RedisConnectionError

from controlplane.gateway import generation, router
from controlplane.gateway.dispatched import Dispatched, dispatched_key
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


async def test_concurrent_pickers_in_two_web_processes_spread_a_burst(client):
    web1, web2 = Dispatched(client), Dispatched(aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True))
    picks = await asyncio.gather(*(web.pick(f"r{i}", IDLE) for i, web in enumerate([web1, web2] * 4)))
    assert Counter(rid for rid, _ in picks) == {A: 4, B: 4}
    assert await client.zcard(dispatched_key(A)) == await client.zcard(dispatched_key(B)) == 4
    await web2.redis.aclose()


async def test_the_cost_is_the_larger_of_reported_and_dispatched_then_free_kv_blocks(client):
    web = Dispatched(client)
    busy = [(A, 3, 100), (B, 0, 100)]  # A reports 3 requests this gateway did not send
    assert [(await web.pick(f"r{i}", busy))[0] for i in range(3)] == [B, B, B]
    assert (await web.pick("r3", busy)) == (A, 3)  # 3 against 3: a tie, the first candidate
    report = [(A, 0, 10), (B, 0, 50)]  # a heartbeat that has not seen any of them yet
    assert [(await web.pick(f"r{i}", report))[0] for i in (4, 5)] == [A, A]  # A: 1, 2 against B: 3
    assert (await web.pick("r6", report)) == (B, 3)  # 3 against 3: B has more free KV blocks
    assert (await web.pick("r7", [(A, 9, 10), (B, 0, 50)])) == (B, 4)


async def test_an_ended_request_stops_counting(client):
    web = Dispatched(client)
    rid, _ = await web.pick("r1", IDLE)
    assert await client.zcard(dispatched_key(rid)) == 1
    await web.done("r1")
    await web.done("r1")  # twice: harmless
    assert await client.zcard(dispatched_key(rid)) == 0 and web.open == {}
    assert (await web.pick("r2", IDLE)) == (A, 0)


async def test_a_dead_web_process_leaves_nothing_counted_past_the_expiry(client):
    dead = Dispatched(client, ttl=0)  # its entries expire at once, as they would TTL later
    for i in range(3):
        assert (await dead.pick(f"r{i}", IDLE)) == (A, 0)  # an expired entry no longer counts
    alive = Dispatched(client, ttl=0)
    await alive.pick("kept", IDLE)
    alive.ttl = 30
    await alive.refresh()  # a live process pushes its open requests' expiry forward
    assert (await alive.pick("next", IDLE))[0] == B
    await alive.done("kept")
    await alive.refresh()  # and does not bring back one that ended
    assert await client.zscore(dispatched_key(A), "kept") is None


async def test_a_request_that_fails_between_its_pick_and_its_sending_stops_counting(client, monkeypatch):
    """The router counts the request, then may still fail (the session-affinity write, the
    prefill replicas' statuses, a client that goes away): nothing was sent, nothing counts."""
    web = Dispatched(client)

    async def choose(hub, deployment, candidates, request_id, *args):
        await hub.dispatched.pick(request_id, IDLE)
        raise RedisConnectionError("gone after the pick")

    monkeypatch.setattr(router, "choose", choose)
    with pytest.raises(RedisConnectionError):
        await generation._place(SimpleNamespace(dispatched=web), SimpleNamespace(slug="d"),
                                {"decode": [A, B], "prefill": []}, GenerateMessage(), lambda: "r1")  # fmt: skip
    assert web.open == {} and await client.zcard(dispatched_key(A)) == 0
