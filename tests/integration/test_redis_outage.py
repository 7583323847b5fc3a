"""A replica outlives a Redis outage: the request in flight when Redis goes away is aborted (its
KV freed), the process keeps its loaded model, and once Redis is back (empty, as a restarted
Redis without persistence is) it reports itself ready again and serves new requests. The test
runs its own redis-server on a free port: the machine's Redis is never stopped."""

from __future__ import annotations

import json
import uuid

import pytest
import redis

from tests.support.stack import pid_alive, wait_for
from workers.bench.processes import RedisServer, start_replica
from workers.protocol import replica as protocol
from workers.protocol.replica import ReplicaSpec

pytestmark = pytest.mark.timeout(180)
REPLICA = 9301


def _send(client: redis.Redis, channel: str, max_tokens: int) -> str:
    rid = f"t-{uuid.uuid4().hex[:8]}"
    params = {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}
    message = {
        "type": "generate",
        "id": rid,
        "reply_to": channel,
        "prompt_token_ids": list(range(5, 25)),
        "params": params,
    }
    client.xadd(protocol.requests_key(REPLICA), {"m": json.dumps(message)})
    return rid


def _events(pubsub, until, timeout: float) -> list[dict]:
    out = []

    def step():
        message = pubsub.get_message(timeout=0.2)
        if message and message["type"] == "message":
            out.append(json.loads(message["data"]))
        return until(out)

    wait_for(step, timeout, "replica events", interval=0)
    return out


def test_replica_survives_a_redis_outage_and_serves_when_it_returns(model_dir, tmp_path):
    server = RedisServer()
    server.start()
    client = redis.Redis(port=server.port, decode_responses=True)
    spec = ReplicaSpec(replica_id=REPLICA, deployment="outage", model_dir=str(model_dir), model_name="tiny",
                       dtype="float32", block_size=4, threads=1, redis_url=server.url,
                       kv_cache_bytes=16 << 20)  # fmt: skip
    process, log = start_replica(spec, tmp_path)
    log_path = tmp_path / f"replica-{REPLICA}.log"
    try:
        wait_for(lambda: client.hget(protocol.status_key(REPLICA), "state") == "ready", 90, "the replica")
        channel = f"reply-{uuid.uuid4().hex[:6]}"
        pubsub = client.pubsub()
        pubsub.subscribe(channel)
        _send(client, channel, max_tokens=100_000)  # runs until Redis goes away
        _events(pubsub, lambda evs: sum(e["type"] == "delta" for e in evs) >= 3, 30)

        server.kill()
        wait_for(lambda: "aborting 1 request(s) in flight" in log_path.read_text(), 30, "the replica to notice")
        assert process.poll() is None  # still running, model still loaded

        server.start()  # back, and empty
        client = redis.Redis(port=server.port, decode_responses=True)
        wait_for(lambda: client.hget(protocol.status_key(REPLICA), "state") == "ready", 30, "a fresh heartbeat")
        channel = f"reply-{uuid.uuid4().hex[:6]}"
        pubsub = client.pubsub()
        pubsub.subscribe(channel)
        pubsub.get_message(timeout=1)
        rid = _send(client, channel, max_tokens=8)
        events = _events(pubsub, lambda evs: any(e.get("finish_reason") for e in evs), 30)
        assert [e["type"] for e in events] == ["accepted"] + ["delta"] * 8 and events[0]["id"] == rid
        assert events[-1]["usage"]["completion_tokens"] == 8

        def idle() -> dict | None:  # `load` is written by the heartbeat, which may predate the finish
            load = json.loads(client.hget(protocol.status_key(REPLICA), "load"))
            return load if load["running"] == 0 else None

        load = wait_for(idle, 10, "a heartbeat after the request finished")
        assert load["kv_blocks_free"] == load["kv_blocks_total"]  # the aborted one freed
        assert pid_alive(process.pid) and "Redis is back" in log_path.read_text()
    finally:
        process.kill()
        process.wait()
        log.close()
        server.kill()
