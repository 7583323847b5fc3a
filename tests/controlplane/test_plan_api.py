"""POST /api/v1/plan/ and the fit check of deployment creation: who may plan, what the answer
holds, the 400s naming their numbers, and deployments refused when their weights cannot fit the
CUDA devices of the inventory (while CPU, hub and small deployments are accepted as before)."""

import json
import shutil
from pathlib import Path

import pytest

from controlplane.catalog.models import Model
from controlplane.common.errors import DomainError
from controlplane.deployments.models import Deployment
from controlplane.inventory.services import register_node
from controlplane.planner.services import check_deployment_fits

pytestmark = pytest.mark.django_db

FIXTURES = Path(__file__).resolve().parents[2] / "controlplane" / "planner" / "fixtures"
GB = 10**9
LLAMA_70B_BYTES = 141_107_412_992  # bf16; test_capacity_planner computes it by hand


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name / "config.json").read_text())


def config_model(tmp_path, fixture_name: str, name: str) -> Model:
    """A registered model whose directory holds only the fixture's config.json (no weights): as
    registration would have recorded it, without reading weights that are not there."""
    directory = tmp_path / name
    directory.mkdir()
    shutil.copy(FIXTURES / fixture_name / "config.json", directory / "config.json")
    return Model.objects.create(
        name=name,
        source=str(directory),
        status=Model.Status.READY,
        architecture=fixture(fixture_name)["architectures"][0],
    )


def gpus(name: str, count: int, memory: int, kind: str = "cuda"):
    devices = [
        {"index": i, "kind": kind, "name": "H100" if kind == "cuda" else "cpu", "memory_total": memory}
        for i in range(count)
    ]
    return register_node(name=name, hostname=name, devices=devices)


# -- the plan endpoint ------------------------------------------------------------------------------
@pytest.mark.parametrize(("client_kind", "status"), [("anon_client", 401), ("user_client", 200), ("staff_client", 200)])
def test_any_signed_in_user_may_plan(request, client_kind, status):
    client = request.getfixturevalue(client_kind)
    response = client.post("/api/v1/plan/", {"config": fixture("llama-3.1-70b")}, format="json")
    assert response.status_code == status


def test_plan_of_a_config_answers_every_figure_and_how(user_client):
    body = {
        "config": fixture("kimi-k2.5"),
        "tensor_parallel": 8,
        "device_memory_bytes": 80 * GB,
        "memory_fraction": 1.0,
    }
    response = user_client.post("/api/v1/plan/", body, format="json")
    assert response.status_code == 200, response.json()
    plan = response.json()
    assert plan["model"] is None and plan["device_memory_source"] == "request"
    assert (plan["attention"], plan["quantization"]) == ("mla", "int4-experts")
    assert plan["weight_bytes_total"] == 595_147_639_776 and plan["kv_bytes_per_token"] == 70_272
    assert plan["max_kv_tokens"] == 40_914 and plan["attention_data_parallel"]["max_kv_tokens"] == 8 * 40_914
    for key in (
        "params_total",
        "params_active",
        "weight_bytes_per_device",
        "kv_bytes_per_token_per_device",
        "free_bytes_per_device",
        "max_batch_at_context",
        "notes",
        "stages",
        "params",
        "weight_bytes",
    ):
        assert key in plan
    assert any("replicated on each of the 8 tensor-parallel ranks" in note for note in plan["notes"])


def test_plan_of_a_registered_model_reads_its_config(user_client, tmp_path):
    model = config_model(tmp_path, "deepseek-v3", "deepseek-v3")
    for reference in ("deepseek-v3", str(model.pk)):
        response = user_client.post("/api/v1/plan/", {"model": reference}, format="json")
        assert response.status_code == 200, response.json()
        assert response.json()["model"] == "deepseek-v3" and response.json()["params_total"] == 671_026_419_200


def test_device_memory_defaults_to_the_inventorys_largest_cuda_devices(user_client):
    gpus("small", 8, 80 * GB)
    gpus("large", 8, 141 << 30)
    gpus("cpu-only", 1, 64 * GB, kind="cpu")
    plan = user_client.post("/api/v1/plan/", {"config": fixture("llama-3.1-70b")}, format="json").json()
    assert plan["device_memory_bytes"] == 141 << 30
    assert plan["device_memory_source"].startswith("inventory: node large's H100")


def test_without_device_memory_the_plan_says_what_is_missing(user_client):
    plan = user_client.post("/api/v1/plan/", {"config": fixture("llama-3.1-70b")}, format="json").json()
    assert plan["device_memory_bytes"] is None and plan["fits"] is None and plan["max_kv_tokens"] is None
    assert plan["device_memory_source"].startswith("none")


def test_a_layout_that_does_not_fit_is_planned_with_its_shortfall(user_client):
    body = {"config": fixture("llama-3.1-70b"), "device_memory_bytes": 80 * GB}
    plan = user_client.post("/api/v1/plan/", body, format="json").json()
    assert plan["fits"] is False and plan["free_bytes_per_device"] == 68 * GB - LLAMA_70B_BYTES
    assert f"does not fit: {LLAMA_70B_BYTES:,} bytes of weights per device exceed the 68,000,000,000 usable" in (
        " ".join(plan["notes"])
    )


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({}, "non_field_errors", "give either model"),
        ({"model": "x", "config": {}}, "non_field_errors", "give either model"),
        ({"model": "nope"}, "model", "no registered model named 'nope'"),
        ({"config": "{}"}, "config", "config must be a config.json object, got str"),
        ({"config": {"architectures": ["LlamaForCausalLM"]}}, "config", "config has no 'hidden_size'"),
        ({"config": {"architectures": ["BertModel"]}}, "config", "'BertModel' is not one the planner sizes"),
        ({"config": fixture("llama-3.1-70b"), "quantization": "int3"}, "quantization", "int3"),
        ({"config": fixture("llama-3.1-70b"), "quantization": "int4-experts"}, "quantization", "a dense model"),
        (
            {"config": fixture("llama-3.1-70b"), "tensor_parallel": 3},
            "tensor_parallel",
            "tensor_parallel 3 does not divide the 64 attention heads",
        ),
        (
            {"config": fixture("deepseek-v3"), "tensor_parallel": 256},
            "tensor_parallel",
            "tensor_parallel 256 does not divide the 128 attention heads",
        ),
        ({"config": fixture("llama-3.1-70b"), "pipeline_parallel": 81}, "pipeline_parallel", "80 layers"),
        ({"config": fixture("llama-3.1-70b"), "memory_fraction": 1.5}, "memory_fraction", "1"),
        ({"config": fixture("llama-3.1-70b"), "device_memory_bytes": 0}, "device_memory_bytes", "1"),
    ],
)
def test_bad_plans_are_400s_naming_the_field_and_numbers(user_client, body, field, says):
    response = user_client.post("/api/v1/plan/", body, format="json")
    assert response.status_code == 400, response.json()
    assert says in " ".join(response.json()[field])


def test_a_hub_model_has_no_config_to_plan(user_client):
    Model.objects.create(name="hub", source="org/hub", source_type=Model.Source.HUB)
    response = user_client.post("/api/v1/plan/", {"model": "hub"}, format="json")
    assert response.status_code == 400 and "send the config instead" in response.json()["model"][0]


# -- deployment creation ------------------------------------------------------------------------------
def test_a_deployment_whose_weights_cannot_fit_is_refused_naming_the_numbers(staff_client, tmp_path):
    config_model(tmp_path, "llama-3.1-70b", "llama-70b")
    gpus("gpu-a", 8, 80 * GB)
    response = staff_client.post("/api/v1/deployments/", {"slug": "big", "model": "llama-70b"}, format="json")
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert "model 'llama-70b' does not fit on 1 device per replica" in detail
    assert f"{LLAMA_70B_BYTES:,} bytes (141.11 GB) of weights per device vs 80,000,000,000 bytes (80.00 GB)" in detail
    assert "x memory fraction 0.85 = 68,000,000,000 bytes (68.00 GB) usable on node gpu-a's H100" in detail
    assert not Deployment.objects.exists()


def test_a_deployment_that_fits_some_node_is_accepted(staff_client, tmp_path):
    config_model(tmp_path, "llama-3.1-70b", "llama-70b")
    gpus("gpu-small", 8, 80 * GB)
    gpus("gpu-large", 2, 192 * GB)  # 192 GB x 0.85 holds 141 GB of weights
    response = staff_client.post("/api/v1/deployments/", {"slug": "big", "model": "llama-70b"}, format="json")
    assert response.status_code == 201, response.json()


@pytest.mark.parametrize("inventory", ["cpu node", "no node"])
def test_deployments_no_cuda_node_can_take_are_left_to_placement(staff_client, tmp_path, inventory):
    config_model(tmp_path, "llama-3.1-70b", "llama-70b")
    if inventory == "cpu node":
        gpus("cpu-a", 1, 16 * GB, kind="cpu")
    response = staff_client.post("/api/v1/deployments/", {"slug": "big", "model": "llama-70b"}, format="json")
    assert response.status_code == 201, response.json()


def test_small_hub_and_unreadable_models_are_accepted_on_gpus(staff_client, node, model_dir):
    registered = staff_client.post("/api/v1/models/", {"name": "tiny", "source": str(model_dir)}, format="json")
    assert registered.status_code == 201
    Model.objects.create(name="hub", source="org/hub", source_type=Model.Source.HUB)
    Model.objects.create(name="gone", source="/models/gone", status=Model.Status.READY)
    for name in ("tiny", "hub", "gone"):
        response = staff_client.post("/api/v1/deployments/", {"slug": f"d-{name}", "model": name}, format="json")
        assert response.status_code == 201, response.json()


def test_changing_a_deployment_to_a_model_that_does_not_fit_is_refused(staff_client, node, model_dir, tmp_path):
    staff_client.post("/api/v1/models/", {"name": "tiny", "source": str(model_dir)}, format="json")
    config_model(tmp_path, "kimi-k2.5", "kimi")
    assert staff_client.post("/api/v1/deployments/", {"slug": "d", "model": "tiny"}, format="json").status_code == 201
    patched = staff_client.patch("/api/v1/deployments/d/", {"model": "kimi"}, format="json")
    assert patched.status_code == 400 and "model 'kimi' does not fit" in patched.json()["detail"]
    assert Deployment.objects.get(slug="d").model.name == "tiny"
    # Scaling does not re-plan.
    assert staff_client.post("/api/v1/deployments/d/scale/", {"replicas": 2}, format="json").status_code == 200


def test_tensor_parallel_layouts_are_checked_once_built(tmp_path):
    """tensor_parallel > 1 is refused as not built before this check; the check itself already
    plans such layouts: Kimi K2.5 on 8 x 80 GB leaves too little at the engine's 0.85."""
    kimi = config_model(tmp_path, "kimi-k2.5", "kimi")
    gpus("h100s", 8, 80 * GB)
    with pytest.raises(DomainError) as caught:
        check_deployment_fits({"model": kimi, "tensor_parallel": 8})
    assert "on 8 devices per replica (tensor_parallel 8 x pipeline_parallel 1, int4-experts" in caught.value.message
    gpus("h200s", 8, 141 << 30)
    check_deployment_fits({"model": kimi, "tensor_parallel": 8})
    with pytest.raises(DomainError) as caught:
        check_deployment_fits({"model": kimi, "tensor_parallel": 3})
    assert caught.value.field == "tensor_parallel"


def test_nodes_with_too_few_cuda_devices_for_a_replica_are_not_judged(tmp_path):
    kimi = config_model(tmp_path, "kimi-k2.5", "kimi")
    gpus("four", 4, 80 * GB)  # a replica of tensor_parallel 8 cannot be placed here at all
    check_deployment_fits({"model": kimi, "tensor_parallel": 8})
    gpus("four", 4, 0)  # and devices that report no memory are not judged either
    check_deployment_fits({"model": kimi})
