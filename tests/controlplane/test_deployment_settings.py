"""Nothing silent in the management API: settings that are not built are refused with a 400
naming the field, never accepted and ignored."""

import pytest

from controlplane.catalog.services import register_model
from controlplane.deployments.models import CachePolicy, Deployment, Replica
from controlplane.deployments.placement import place
from controlplane.deployments.replica_specs import build_spec
from controlplane.inventory.services import register_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def model():
    return register_model(name="tiny", source="org/tiny", source_type="hub")


@pytest.fixture
def cpu_node(db):
    """A CPU node reporting two devices (the agent's CPU_DEVICES=2)."""
    return register_node(
        name="cpu-a",
        hostname="host-a",
        devices=[{"index": i, "kind": "cpu", "name": "cpu", "memory_total": 8 << 30} for i in range(2)],
    )


def test_a_parallel_replica_larger_than_any_node_is_refused_naming_the_numbers(staff_client, model, cpu_node):
    body = {"slug": "d", "model": "tiny", "tensor_parallel": 4}
    response = staff_client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 400
    says = response.json()["tensor_parallel"][0]
    assert "tensor_parallel 4 x pipeline_parallel 1 needs 4 devices" in says and "has 2 healthy devices" in says
    assert not Deployment.objects.exists()


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_a_parallel_replica_speculates(staff_client, model, cpu_node, tp, pp):
    body = {"slug": "d", "model": "tiny", "tensor_parallel": tp, "pipeline_parallel": pp, "speculative_method": "ngram"}
    response = staff_client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 201, response.json()
    spec = build_spec(Replica.objects.create(deployment=Deployment.objects.get(slug="d"), node=cpu_node))
    assert (spec.tensor_parallel, spec.pipeline_parallel, spec.speculative.method) == (tp, pp, "ngram")


def test_a_disaggregated_parallel_deployment_gives_prefill_and_decode_replicas_the_same_ranks(
    staff_client, model, cpu_node
):
    body = {"slug": "d", "model": "tiny", "tensor_parallel": 2, "mode": "disaggregated", "prefill_replicas": 1,
            "decode_replicas": 1}  # fmt: skip
    response = staff_client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 201, response.json()
    dep = Deployment.objects.get(slug="d")
    for role in ("prefill", "decode"):  # rank to rank: both groups have the deployment's shape
        replica = Replica.objects.create(deployment=dep, node=cpu_node, role=role)
        spec = build_spec(replica)
        assert (spec.role, spec.tensor_parallel, spec.pipeline_parallel) == (role, 2, 1)


def test_a_parallel_replica_takes_one_device_per_rank_on_one_node(staff_client, model, cpu_node):
    response = staff_client.post(
        "/api/v1/deployments/", {"slug": "d", "model": "tiny", "tensor_parallel": 2}, format="json"
    )
    assert response.status_code == 201, response.json()
    dep = Deployment.objects.get(slug="d")
    placed = place(dep)
    assert placed is not None
    node, devices = placed
    assert node == cpu_node and sorted(d.index for d in devices) == [0, 1]
    replica = Replica.objects.create(deployment=dep, node=node, role="colocated")
    replica.devices.set(devices)
    spec = build_spec(replica)
    assert (spec.tensor_parallel, spec.pipeline_parallel) == (2, 1)
    shown = staff_client.get(f"/api/v1/replicas/{replica.pk}/").json()
    assert shown["ranks"] == [{"rank": 0, "device": "cpu:0"}, {"rank": 1, "device": "cpu:1"}]


def test_deployment_defaults_spelled_out_are_accepted(staff_client, model):
    body = {"slug": "d", "model": "tiny", "tensor_parallel": 1, "pipeline_parallel": 1,
            "speculative_method": "none", "draft_model": None, "speculative_k": 4}  # fmt: skip
    response = staff_client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 201, response.json()


@pytest.mark.parametrize("value", ["x session", "x-sess:ion", "Authorization", "Cookie", ""])
def test_a_session_affinity_header_that_is_no_header_name_or_a_reserved_one_is_refused(staff_client, value):
    response = staff_client.post(
        "/api/v1/cache-policies/", {"name": "p", "session_affinity_header": value}, format="json"
    )
    assert response.status_code == 400 and "session_affinity_header" in response.json()
    assert not CachePolicy.objects.exists()


def test_routing_settings_are_stored_and_bad_ones_refused(staff_client):
    body = {"name": "p", "session_affinity_header": "X-Conversation", "routing": "kv_aware",
            "affinity_load_factor": 1.5}  # fmt: skip
    response = staff_client.post("/api/v1/cache-policies/", body, format="json")
    assert response.status_code == 201, response.json()
    policy = CachePolicy.objects.get()
    assert (policy.session_affinity_header, policy.routing, policy.affinity_load_factor) == (
        "x-conversation", "kv_aware", 1.5)  # fmt: skip
    for field, value in [("routing", "fastest"), ("affinity_load_factor", 0.5), ("affinity_load_factor", "NaN")]:
        patched = staff_client.patch(f"/api/v1/cache-policies/{policy.pk}/", {field: value}, format="json")
        assert patched.status_code == 400 and field in patched.json(), (field, value, patched.json())


def test_cache_policy_built_settings_are_accepted(staff_client):
    body = {"name": "p", "prefix_caching": False, "block_size": 32, "session_affinity_header": "X-Session-Affinity",
            "session_affinity_ttl_seconds": 60, "dram_tier_bytes": 0, "disk_tier_path": "", "disk_tier_bytes": 0,
            "min_cached_prefix_tokens": 0}  # fmt: skip
    response = staff_client.post("/api/v1/cache-policies/", body, format="json")
    assert response.status_code == 201, response.json()
