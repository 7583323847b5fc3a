"""A replica process started from a spec with KV tiers (as a node agent starts one) runs its engine
with them and reports them: with a DRAM tier, a prompt whose blocks left the device cache comes
back from host memory, and the status hash and /metrics say so per tier. Two replicas sharing the
Mooncake Store (a real mooncake_master) share a session turn's context: what one computed for a
turn, the other loads. A replica stops cleanly with its tiers (engine.close())."""

from __future__ import annotations

import signal

import pytest
import redis
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from controlplane.catalog.models import Model
from controlplane.deployments.models import Deployment, Replica
from controlplane.telemetry.prometheus import render
from tests.support.stack import replica_request, wait_for
from workers.bench.processes import start_replica, stop
from workers.demo import MODEL_DIR
from workers.kvtiers.master import free_port, start_master, stop_master
from workers.protocol import replica as protocol
from workers.protocol.replica import KVTiersSpec, ReplicaSpec, ReplicaStatus

pytestmark = pytest.mark.timeout(180)
DRAM, STORE_A, STORE_B = 9531, 9532, 9533
BLOCK = 16
# 32 blocks of the demo model's KV (fp32: 2 KiB a token): a 161-token prompt takes 11, so three
# fillers of 241 tokens push its 10 cacheable blocks out of the device cache.
KV_BYTES = 1 << 20
PROMPT = [(7 * i + 3) % 1000 + 5 for i in range(161)]
FILLERS = [[(11 * i + k) % 1000 + 5 for i in range(241)] for k in (1, 2, 3)]
GREEDY = {"temperature": 0.0, "max_tokens": 4, "ignore_eos": True}


def spec(replica_id: int, tiers: KVTiersSpec) -> ReplicaSpec:
    return ReplicaSpec(replica_id=replica_id, deployment="tiers", model_dir=str(MODEL_DIR), model_name="demo",
                       dtype="float32", threads=1, redis_url=settings.REDIS_URL, kv_cache_bytes=KV_BYTES,
                       kv_tiers=tiers)  # fmt: skip


@pytest.fixture(scope="module")
def client():
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    yield client
    client.close()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, client):
    """The DRAM replica and two replicas sharing a store, all started at once (loading overlaps)."""
    state = tmp_path_factory.mktemp("tier-replicas")
    port = free_port()
    master = start_master(port, free_port(), log_path=state / "master.log")
    shared = KVTiersSpec(store_master=f"127.0.0.1:{port}", store_segment_bytes=32 << 20)
    specs = [spec(DRAM, KVTiersSpec(dram_bytes=KV_BYTES)), spec(STORE_A, shared), spec(STORE_B, shared)]
    started = {}
    try:
        for s in specs:
            client.delete(protocol.status_key(s.replica_id), protocol.requests_key(s.replica_id))
            started[s.replica_id] = start_replica(s, state)
        for rid in started:
            wait_for(lambda rid=rid: client.hget(protocol.status_key(rid), "state") == "ready", 120, f"replica {rid}")
        yield started
    finally:
        stop([p for p, _ in started.values()], [log for _, log in started.values()], timeout=15)
        stop_master(master)


def generate(client, replica_id: int, prompt: list[int], **extra) -> dict:
    events = replica_request(client, replica_id, GREEDY, prompt_token_ids=prompt, **extra)
    return {
        "tokens": [t for e in events for t in e.get("token_ids", [])],
        "cached": events[-1]["usage"]["cached_tokens"],
    }


def tiers_of(client, replica_id: int) -> dict:
    return ReplicaStatus.from_hash(client.hgetall(protocol.status_key(replica_id))).load.get("kv_tiers") or {}


def test_a_prefix_evicted_from_the_device_comes_back_from_dram_and_the_replica_reports_it(client, replicas, db):
    first = generate(client, DRAM, PROMPT)
    assert generate(client, DRAM, PROMPT)["cached"] == 160  # the device cache: 10 full blocks
    for filler in FILLERS:
        generate(client, DRAM, filler)
    again = generate(client, DRAM, PROMPT)
    assert again == {"tokens": first["tokens"], "cached": 160}  # from host memory, the same answer

    def loaded():
        tiers = tiers_of(client, DRAM)
        return tiers if tiers.get("blocks_loaded", {}).get("dram", 0) >= 10 else None

    tiers = wait_for(loaded, 5, "the replica to report the blocks it loaded from DRAM")
    assert set(tiers["tiers"]) == {"dram"} and set(tiers["blocks_loaded"]) == {"dram"}
    dram = tiers["tiers"]["dram"]
    assert dram["hits"] >= 10 and dram["capacity_bytes"] == KV_BYTES and 0 < dram["used_bytes"] <= KV_BYTES
    assert dram["bytes_written"] > 0 and dram["bytes_read"] > 0 and dram["available"] is True
    assert dram["checksum_failures"] == 0

    # /metrics, as the web process renders it from the same status hash.
    deployment = Deployment.objects.create(slug="tiers", model=Model.objects.create(name="demo", source=str(MODEL_DIR)))
    Replica.objects.create(pk=DRAM, deployment=deployment, state=Replica.State.READY)
    samples = {
        (s.name, s.labels.get("tier")): s.value
        for f in text_string_to_metric_families(render(client))
        for s in f.samples
        if s.name.startswith("switchyard_kv_tier_") and s.labels.get("replica") == str(DRAM)
    }
    assert samples[("switchyard_kv_tier_blocks_loaded_total", "dram")] >= 10
    assert samples[("switchyard_kv_tier_hits_total", "dram")] >= 10
    assert samples[("switchyard_kv_tier_capacity_bytes", "dram")] == KV_BYTES
    assert samples[("switchyard_kv_tier_available", "dram")] == 1


def test_a_session_turn_computed_by_one_replica_is_loaded_by_another_through_the_store(client, replicas):
    for rid in (STORE_A, STORE_B):
        wait_for(
            lambda rid=rid: tiers_of(client, rid).get("tiers", {}).get("store", {}).get("available"),
            30,
            f"replica {rid} to reach the store",
        )
    plain = [t + 1 for t in PROMPT]  # not a session turn, never hit: kept out of the store
    generate(client, STORE_A, plain)
    turn = generate(client, STORE_A, PROMPT, session_turn=True)

    def shared():  # the turn's blocks are written to the store off the engine's thread
        return tiers_of(client, STORE_A)["tiers"]["store"]["bytes_written"] >= 10 * BLOCK * 2048

    wait_for(shared, 10, "replica A to put the turn's blocks in the store")
    assert generate(client, STORE_B, PROMPT) == {"tokens": turn["tokens"], "cached": 160}
    assert generate(client, STORE_B, plain)["cached"] == 0
    loaded = wait_for(lambda: tiers_of(client, STORE_B)["blocks_loaded"].get("store"), 5, "B to report its load")
    assert loaded == 10


def test_a_replica_with_tiers_stops_cleanly_on_sigterm(client, replicas):
    process, _ = replicas[STORE_B]
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    assert client.hget(protocol.status_key(STORE_B), "state") == "stopped"
