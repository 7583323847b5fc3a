"""The gateway's Redis pool outlives a Redis restart: a pooled connection opened before the
restart fails its next command ("Connection closed by server"), and without a retry on a fresh
connection that failure reached the client as a 503 (one stream of 1,000 in the chaos
benchmark). The test runs its own redis-server on a free port: the machine's is never stopped."""

import asyncio

import pytest

from controlplane.gateway.hub import ReplicaHub
from workers.bench.processes import RedisServer
from workers.protocol import replica as protocol

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
REPLICA = 9311


async def test_pooled_connections_opened_before_a_redis_restart_are_replaced():
    server = RedisServer()
    server.start()
    hub = ReplicaHub(server.url)
    try:
        # 30 connections in use at once: the pool keeps them all, idle, for later commands.
        await asyncio.gather(*(hub.redis.blpop(["nothing"], 0.2) for _ in range(30)))
        assert len(hub.redis.connection_pool._available_connections) >= 30
        server.kill()
        server.start()  # the same port, an empty Redis
        sent = await asyncio.gather(*(hub.abort(REPLICA, f"r{i}") for i in range(30)), return_exceptions=True)
        assert [r for r in sent if isinstance(r, Exception)] == []
        assert await hub.redis.xlen(protocol.requests_key(REPLICA)) == 30
        statuses = await hub.statuses([REPLICA])  # a pipeline, on whichever connection comes next
        assert statuses[0].state != "ready"
    finally:
        await hub.redis.aclose()
        server.kill()
