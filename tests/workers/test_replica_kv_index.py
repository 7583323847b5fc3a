"""A replica process (the real engine, and the simulated one: workers/sim) publishes the block
hashes its prefix cache holds into its Redis set (workers/protocol/kv_blocks.py): after two
requests with the same prompt the set is exactly the blocks they computed and a router's lookup
finds the prompt's prefix; after Redis restarts empty the replica writes the whole set again; a
replica that stops leaves no set behind. The replica runs against a redis-server of its own so
that the test can restart it. Beside the set, the phase times its deltas carry."""

from __future__ import annotations

import asyncio
import signal

import pytest
import redis
import redis.asyncio

from tests.support.stack import replica_request, wait_for
from workers.bench.processes import RedisServer, start_replica
from workers.protocol import replica as protocol
from workers.protocol.kv_blocks import cached_blocks, kv_index_key, prefix_hashes
from workers.protocol.replica import ReplicaSpec, ReplicaStatus

pytestmark = pytest.mark.timeout(120)
REPLICA = 9411
BLOCK = 4
PROMPT = list(range(40, 61))  # 21 tokens: 5 reusable full blocks
MAX_TOKENS = 4


@pytest.fixture(scope="module", params=["real", "sim"])
def replica(request, model_dir, tmp_path_factory):
    state = tmp_path_factory.mktemp("kv-index")
    server = RedisServer()
    server.start()
    client = redis.Redis(port=server.port, decode_responses=True)
    client.sadd(kv_index_key(REPLICA), "123")  # left by an earlier incarnation
    spec = ReplicaSpec(replica_id=REPLICA, deployment="kv-index", model_dir=str(model_dir), model_name="tiny",
                       engine=request.param, dtype="float32", block_size=BLOCK, threads=1, redis_url=server.url,
                       kv_cache_bytes=16 << 20)  # fmt: skip
    process, log = start_replica(spec, state)
    try:
        wait_for(lambda: client.hget(protocol.status_key(REPLICA), "state") == "ready", 90, "the replica")
        yield {"redis": client, "server": server, "process": process}
    finally:
        process.kill()
        process.wait()
        log.close()
        client.close()
        server.kill()


def generate(client: redis.Redis, prompt: list[int]) -> tuple[list[int], dict]:
    """Send one greedy request; its output token ids and usage."""
    params = {"temperature": 0.0, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    events = replica_request(client, REPLICA, params, prompt_token_ids=prompt)
    return [t for event in events for t in event.get("token_ids", [])], events[-1]["usage"]


def members(client: redis.Redis) -> set[int]:
    return {int(h) for h in client.smembers(kv_index_key(REPLICA))}


def lookup(url: str, hashes: list[int]) -> dict[int, int]:
    async def ask():
        client = redis.asyncio.Redis.from_url(url)
        try:
            return await cached_blocks(client, [REPLICA, REPLICA + 1], hashes)
        finally:
            await client.aclose()

    return asyncio.run(ask())


def test_the_set_holds_the_blocks_the_replica_computed(replica):
    client = replica["redis"]
    first, usage = generate(client, PROMPT)
    assert usage["cached_tokens"] == 0
    again, usage = generate(client, PROMPT)
    assert again == first and usage["cached_tokens"] == len(prefix_hashes(PROMPT, BLOCK)) * BLOCK == 20
    # Every token but the last sampled one has its K/V cached: the full blocks among them.
    held = set(prefix_hashes(PROMPT + first, BLOCK))
    assert set(prefix_hashes(PROMPT, BLOCK)) < held
    wait_for(lambda: members(client) == held, 5, "the set to hold the computed blocks")  # the earlier "123" is gone
    assert lookup(replica["server"].url, prefix_hashes(PROMPT, BLOCK)) == {REPLICA: 5, REPLICA + 1: 0}
    assert lookup(replica["server"].url, prefix_hashes([7, *PROMPT], BLOCK)) == {REPLICA: 0, REPLICA + 1: 0}
    status = ReplicaStatus.from_hash(client.hgetall(protocol.status_key(REPLICA)))
    assert status.kv_block_size == BLOCK


def test_the_first_delta_carries_the_phases_so_far_and_the_last_all_of_them(replica):
    """The gateway's trace keeps a replica's queue and prefill even when the request moves on
    (tracing.py): they come with the request's first token, and again, with the rest, with its
    last. A sample whose first token is also its last keeps them beside its own times."""
    client = replica["redis"]
    params = {"temperature": 0.0, "max_tokens": 3, "ignore_eos": True}
    deltas = [e for e in replica_request(client, REPLICA, params, prompt_token_ids=PROMPT) if e["type"] == "delta"]
    first, last = deltas[0], deltas[-1]
    assert {"queue_ms", "prefill_ms"} <= set(first["timings"]) and first["timings"]["prefill_ms"] > 0
    assert all("timings" not in d for d in deltas[1:-1]) and first is not last
    assert {"queue_ms", "prefill_ms", "decode_ms", "ttft_ms", "total_ms"} <= set(last["timings"])
    assert last["timings"]["prefill_ms"] == first["timings"]["prefill_ms"]
    one = {**params, "max_tokens": 1, "n": 2}
    [only] = [e for e in replica_request(client, REPLICA, one, prompt_token_ids=PROMPT) if e["type"] == "delta"]
    assert only["finish_reason"] and {"queue_ms", "prefill_ms", "ttft_ms", "total_ms"} <= set(only["timings"])


def test_after_redis_restarts_empty_the_replica_publishes_its_whole_cache_again(replica):
    client, server = replica["redis"], replica["server"]
    first, _ = generate(client, PROMPT)
    held = set(prefix_hashes(PROMPT + first, BLOCK))
    wait_for(lambda: held <= members(client), 5, "the set to hold the prompt's blocks")
    server.kill()
    server.start()  # same port, nothing kept
    assert members(client) == set()
    wait_for(lambda: held <= members(client), 15, "the replica to publish its cache again")


def test_a_replica_that_stops_leaves_no_set(replica):
    client, process = replica["redis"], replica["process"]
    generate(client, PROMPT)
    wait_for(lambda: members(client), 5, "the set to fill")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert not client.exists(kv_index_key(REPLICA))
    assert client.hget(protocol.status_key(REPLICA), "state") == "stopped"
