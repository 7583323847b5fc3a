"""A cache policy's KV tiers (DRAM, disk, the fleet's Mooncake Store): what the management API
accepts and refuses (a 400 naming the field and what to do), and how they reach the replica spec
the node agent starts a replica from."""

import logging

import pytest
from django.conf import settings
from django.test import override_settings

from controlplane.catalog.services import register_model
from controlplane.deployments.models import CachePolicy, Replica
from controlplane.deployments.replica_specs import build_spec
from controlplane.deployments.services import create_deployment
from workers.protocol.control import spec_from_wire
from workers.protocol.replica import KVTiersSpec

pytestmark = pytest.mark.django_db
MASTER = "10.0.0.5:50051"


def with_store(master: str = MASTER, metrics: str = ""):
    return override_settings(SWITCHYARD={**settings.SWITCHYARD, "KV_STORE_MASTER": master, "KV_STORE_METRICS": metrics})


def create(client, **fields):
    return client.post("/api/v1/cache-policies/", {"name": "p", **fields}, format="json")


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"disk_tier_bytes": 1 << 30}, "disk_tier_path", "a disk tier needs a directory"),
        ({"disk_tier_path": "/var/cache/kv"}, "disk_tier_bytes", "a disk tier needs a byte budget"),
        ({"disk_tier_path": "cache/kv", "disk_tier_bytes": 1 << 30}, "disk_tier_path", "must be an absolute directory"),
        ({"disk_tier_path": "/var/../etc", "disk_tier_bytes": 1 << 30}, "disk_tier_path", "without '..'"),
        ({"dram_tier_bytes": 1 << 30, "prefix_caching": False}, "prefix_caching", "KV tiers extend the prefix cache"),
        ({"min_cached_prefix_tokens": 64}, "min_cached_prefix_tokens", "this policy has neither"),
        ({"min_cached_prefix_tokens": 64, "dram_tier_bytes": 1 << 30}, "min_cached_prefix_tokens", "has neither"),
        ({"dram_tier_bytes": -1}, "dram_tier_bytes", "greater than or equal to 0"),
    ],
)
def test_tiers_a_replica_could_not_run_are_refused_naming_the_field(staff_client, fields, field, says):
    response = create(staff_client, **fields)
    assert response.status_code == 400
    assert says in response.json()[field][0], response.json()
    assert not CachePolicy.objects.exists()

    created = create(staff_client).json()
    patched = staff_client.patch(f"/api/v1/cache-policies/{created['id']}/", fields, format="json")
    assert patched.status_code == 400 and says in patched.json()[field][0]
    assert CachePolicy.objects.get().dram_tier_bytes == 0


def test_the_store_is_refused_until_this_control_plane_has_one_and_says_how_to_set_it_up(staff_client):
    with with_store(""):
        response = create(staff_client, store_tier=True)
    assert response.status_code == 400
    says = response.json()["store_tier"][0]
    assert "SWITCHYARD_KV_STORE_MASTER" in says and "mooncake_master" in says and "docs/operations.md" in says
    with with_store():
        response = create(staff_client, store_tier=True, min_cached_prefix_tokens=256)
    assert response.status_code == 201, response.json()
    assert response.json()["store_tier"] is True


def test_every_tier_together_is_stored_and_read_back(staff_client):
    body = {
        "dram_tier_bytes": 2 << 30,
        "disk_tier_path": "/var/cache/switchyard/kv",
        "disk_tier_bytes": 100 << 30,
        "store_tier": True,
        "min_cached_prefix_tokens": 256,
    }
    with with_store():
        response = create(staff_client, **body)
    assert response.status_code == 201, response.json()
    assert {k: response.json()[k] for k in body} == body
    # The console finds a deployment's policy by name.
    listed = staff_client.get("/api/v1/cache-policies/", {"name": "p"}).json()["results"]
    assert [p["name"] for p in listed] == ["p"] and listed[0]["store_tier"] is True
    assert staff_client.get("/api/v1/cache-policies/", {"name": "other"}).json()["results"] == []


@pytest.fixture
def deployment_with():
    model = register_model(name="tiny", source="org/tiny", source_type="hub")

    def make(slug: str, mode: str = "colocated", **policy):
        cache_policy = CachePolicy.objects.create(name=f"{slug}-policy", **policy) if policy else None
        counts = {"replicas": 1} if mode == "colocated" else {"prefill_replicas": 1, "decode_replicas": 1}
        return create_deployment({"slug": slug, "model": model, "mode": mode, "cache_policy": cache_policy, **counts})

    return make


def spec_of(deployment, role=Replica.Role.COLOCATED):
    wire = build_spec(Replica.objects.create(deployment=deployment, role=role)).to_wire()
    return spec_from_wire(wire)  # as the node agent reads it


def test_the_replica_spec_carries_the_policys_tiers_to_every_role(deployment_with):
    with with_store(metrics="10.0.0.5:9003"):
        everything = deployment_with("all", mode="disaggregated", dram_tier_bytes=1 << 30, store_tier=True,
                                     disk_tier_path="/var/cache/kv", disk_tier_bytes=8 << 30,
                                     min_cached_prefix_tokens=128)  # fmt: skip
        for role in (Replica.Role.PREFILL, Replica.Role.DECODE):
            # The node agent fills in its own address, protocol and what it lends the store.
            assert spec_of(everything, role).kv_tiers == KVTiersSpec(
                dram_bytes=1 << 30,
                disk_path="/var/cache/kv",
                disk_bytes=8 << 30,
                store_master=MASTER,
                store_metrics="10.0.0.5:9003",
                min_prefix_tokens=128,
            )
        assert spec_of(deployment_with("dram", dram_tier_bytes=4 << 20)).kv_tiers == KVTiersSpec(dram_bytes=4 << 20)
    assert spec_of(deployment_with("plain")).kv_tiers is None  # no policy
    assert spec_of(deployment_with("routing-only", routing="kv_aware")).kv_tiers is None


def test_a_store_policy_left_without_the_setting_starts_replicas_without_the_store_and_says_so(deployment_with, caplog):
    with with_store():
        deployment = deployment_with("shared", dram_tier_bytes=1 << 20, store_tier=True)
    caplog.set_level(logging.WARNING, logger="controlplane.deployments.replica_specs")
    with with_store(""):
        assert spec_of(deployment).kv_tiers == KVTiersSpec(dram_bytes=1 << 20)
    assert "SWITCHYARD_KV_STORE_MASTER is not set" in caplog.text
