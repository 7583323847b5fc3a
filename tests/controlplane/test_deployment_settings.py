"""Nothing silent in the management API: settings that are not built are refused with a 400
naming the field, never accepted and ignored."""

import pytest

from controlplane.catalog.services import register_model
from controlplane.deployments.models import CachePolicy, Deployment

pytestmark = pytest.mark.django_db


@pytest.fixture
def model():
    return register_model(name="tiny", source="org/tiny", source_type="hub")


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("tensor_parallel", 2, "tensor_parallel > 1 is not built yet"),
        ("pipeline_parallel", 2, "pipeline_parallel > 1 is not built yet"),
    ],
)
def test_deployment_settings_not_built_are_refused_naming_the_field(staff_client, model, field, value, says):
    response = staff_client.post("/api/v1/deployments/", {"slug": "d", "model": "tiny", field: value}, format="json")
    assert response.status_code == 400
    assert says in response.json()[field][0]
    assert not Deployment.objects.exists()

    staff_client.post("/api/v1/deployments/", {"slug": "d", "model": "tiny"}, format="json")
    patched = staff_client.patch("/api/v1/deployments/d/", {field: value}, format="json")
    assert patched.status_code == 400 and says in patched.json()[field][0]
    assert getattr(Deployment.objects.get(slug="d"), field) != value


def test_deployment_defaults_spelled_out_are_accepted(staff_client, model):
    body = {"slug": "d", "model": "tiny", "tensor_parallel": 1, "pipeline_parallel": 1,
            "speculative_method": "none", "draft_model": None, "speculative_k": 4}  # fmt: skip
    response = staff_client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 201, response.json()


@pytest.mark.parametrize("value", ["x session", "x-sess:ion", "Authorization", "Cookie", ""])
def test_a_session_affinity_header_that_is_no_header_name_or_a_reserved_one_is_refused(staff_client, value):
    response = staff_client.post("/api/v1/cache-policies/", {"name": "p", "session_affinity_header": value},
                                 format="json")  # fmt: skip
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
