"""The node agent fills in its machine's part of a replica's KV tiers: how other store clients
reach this node and what its replicas lend the store. The control plane's part (sizes, the
disk directory, the store's master) is left as the control worker built it."""

from __future__ import annotations

from dataclasses import replace

import redis
from django.conf import settings

from workers.agent.config import AgentConfig
from workers.agent.supervisor import Supervisor
from workers.protocol.replica import KVTiersSpec, ReplicaSpec

MASTER = "10.0.0.5:50051"


def test_the_agent_fills_in_its_address_protocol_and_store_share_for_the_store_only(monkeypatch, tmp_path):
    monkeypatch.setenv("SWITCHYARD_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("KV_TRANSFER_HOST", "10.0.0.12")
    monkeypatch.setenv("KV_TRANSFER_PROTOCOL", "rdma")
    monkeypatch.setenv("KV_STORE_SEGMENT_BYTES", str(1 << 30))
    monkeypatch.setenv("KV_STORE_DEVICE", "mlx5_0")
    sup = Supervisor(AgentConfig.from_env("gpu-2"), redis.Redis.from_url(settings.REDIS_URL), lambda event: None)
    spec = ReplicaSpec(replica_id=7, deployment="d", model_dir="/m", model_name="m")
    shared = KVTiersSpec(
        dram_bytes=1 << 30, disk_path="/var/cache/kv", disk_bytes=8 << 30, store_master=MASTER, min_prefix_tokens=128
    )
    assert sup.node_spec(replace(spec, kv_tiers=shared)).kv_tiers == replace(
        shared, local_hostname="10.0.0.12", store_protocol="rdma", store_device="mlx5_0", store_segment_bytes=1 << 30
    )
    local = KVTiersSpec(dram_bytes=1 << 30)  # nothing of the node's is needed without the store
    assert sup.node_spec(replace(spec, kv_tiers=local)).kv_tiers == local
    assert sup.node_spec(spec).kv_tiers is None
