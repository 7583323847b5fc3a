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
    body = {
        "name": "p",
        "session_affinity_header": "X-Conversation",
        "routing": "kv_aware",
        "affinity_load_factor": 1.5,
    }
    response = staff_client.post("/api/v1/cache-policies/", body, format="json")
    assert response.status_code == 201, response.json()
    policy = CachePolicy.objects.get()
    assert (policy.session_affinity_header, policy.routing, policy.affinity_load_factor) == (
        "x-conversation",
        "kv_aware",
        1.5,
    )
    for field, value in [("routing", "fastest"), ("affinity_load_factor", 0.5), ("affinity_load_factor", "NaN")]:
        patched = staff_client.patch(f"/api/v1/cache-policies/{policy.pk}/", {field: value}, format="json")
        assert patched.status_code == 400 and field in patched.json(), (field, value, patched.json())


def test_cache_policy_built_settings_are_accepted(staff_client):
    body = {"name": "p", "prefix_caching": False, "block_size": 32, "session_affinity_header": "X-Session-Affinity",
            "session_affinity_ttl_seconds": 60, "dram_tier_bytes": 0, "disk_tier_path": "", "disk_tier_bytes": 0,
            "min_cached_prefix_tokens": 0}  # fmt: skip
    response = staff_client.post("/api/v1/cache-policies/", body, format="json")
    assert response.status_code == 201, response.json()


# -- the simulated engine -----------------------------------------------------------------------


@pytest.mark.parametrize(("profile", "expected"), [("", "cpu-demo"), ("h100-llama3-8b", "h100-llama3-8b")])
def test_a_simulated_deployment_sends_its_profile_whole_in_each_spec(staff_client, model, cpu_node, profile, expected):
    from workers.sim.profile import load_profile

    body = {"slug": "s", "model": "tiny", "engine": "sim", "sim_profile": profile}
    response = staff_client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 201, response.json()
    assert (response.json()["engine"], response.json()["sim_profile"]) == ("sim", profile)
    spec = build_spec(Replica.objects.create(deployment=Deployment.objects.get(slug="s"), node=cpu_node))
    assert spec.engine == "sim" and spec.sim_profile == load_profile(expected).to_dict()
    real = staff_client.post("/api/v1/deployments/", {"slug": "r", "model": "tiny"}, format="json")
    assert real.json()["engine"] == "real"
    spec = build_spec(Replica.objects.create(deployment=Deployment.objects.get(slug="r"), node=cpu_node))
    assert spec.engine == "real" and spec.sim_profile is None


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"engine": "real", "sim_profile": "cpu-demo"}, "sim_profile", "read by the simulated engine only"),
        ({"engine": "sim", "sim_profile": "a100"}, "sim_profile", "no simulation profile 'a100'"),
        (
            {"engine": "sim", "mode": "disaggregated", "prefill_replicas": 1, "decode_replicas": 1},
            "mode",
            "is not simulated yet",
        ),
        ({"engine": "sim", "speculative_method": "ngram"}, "speculative_method", "is not simulated yet"),
        ({"engine": "sim", "tensor_parallel": 2}, "tensor_parallel", "is not simulated yet"),
        ({"engine": "quantum"}, "engine", "not a valid choice"),
    ],
)
def test_what_the_simulated_engine_does_not_simulate_is_refused(staff_client, model, cpu_node, body, field, says):
    response = staff_client.post("/api/v1/deployments/", {"slug": "s", "model": "tiny", **body}, format="json")
    assert response.status_code == 400 and says in str(response.json()[field]), response.json()
    assert not Deployment.objects.exists()


def test_a_simulated_deployment_refuses_kv_tiers_and_a_change_to_them(staff_client, model):
    tiers = CachePolicy.objects.create(name="tiers", dram_tier_bytes=1 << 20)
    body = {"slug": "s", "model": "tiny", "engine": "sim", "cache_policy": "tiers"}
    response = staff_client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 400 and "KV tiers of cache_policy 'tiers'" in str(response.json()["cache_policy"])
    assert (
        staff_client.post(
            "/api/v1/deployments/", {"slug": "s", "model": "tiny", "engine": "sim"}, format="json"
        ).status_code
        == 201
    )
    patch = staff_client.patch("/api/v1/deployments/s/", {"cache_policy": tiers.name}, format="json")
    assert patch.status_code == 400 and "is not simulated yet" in str(patch.json()["cache_policy"])
    policy = CachePolicy.objects.create(name="plain")
    assert staff_client.patch("/api/v1/deployments/s/", {"cache_policy": "plain"}, format="json").status_code == 200
    turned_on = staff_client.patch(f"/api/v1/cache-policies/{policy.pk}/", {"dram_tier_bytes": 1 << 20}, format="json")
    assert turned_on.status_code == 400 and "simulated engine" in str(turned_on.json()["dram_tier_bytes"])
