"""Management API: auth, validation, 404s, pagination, and the deployment lifecycle."""

import pytest

from controlplane.catalog.models import Model
from controlplane.deployments.models import Deployment, Replica
from controlplane.deployments.reconciler import reconcile_all
from controlplane.deployments.replica_states import transition_replica
from controlplane.events.models import Event
from controlplane.gateway.models import ApiKey
from controlplane.gateway.services import authenticate

pytestmark = pytest.mark.django_db

LIST_ENDPOINTS = ["models", "deployments", "cache-policies", "api-keys", "nodes", "devices", "replicas", "events"]


@pytest.mark.parametrize("endpoint", LIST_ENDPOINTS)
def test_anonymous_gets_401_with_bearer_challenge(anon_client, endpoint):
    response = anon_client.get(f"/api/v1/{endpoint}/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("client_kind,expected", [("user_client", 403), ("staff_client", 201)])
def test_writes_need_staff(request, client_kind, expected):
    client = request.getfixturevalue(client_kind)
    response = client.post("/api/v1/cache-policies/", {"name": "default"}, format="json")
    assert response.status_code == expected


def test_bad_bearer_token_is_401(anon_client):
    anon_client.credentials(HTTP_AUTHORIZATION="Bearer nope")
    assert anon_client.get("/api/v1/models/").status_code == 401


def test_session_auth_works_for_the_console(client, staff):
    client.login(username="ops", password="pw-ops")
    assert client.get("/api/v1/models/").status_code == 200


def test_register_model_reads_config_and_validates(staff_client, model_dir, django_capture_on_commit_callbacks):
    response = staff_client.post("/api/v1/models/", {"name": "tiny", "source": str(model_dir)}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["architecture"] == "LlamaForCausalLM"
    assert body["parameter_count"] > 100_000
    assert body["context_length"] == 1024
    assert body["status"] == "registered"
    from controlplane.catalog.services import validate_model

    model = validate_model(body["id"])
    assert model.status == Model.Status.READY and len(model.checksum) == 64


def test_register_a_deepseek_v3_model(staff_client, tmp_path):
    """MLA + MoE (DeepSeek-V3, Kimi K2) is an architecture the engine serves: registering it works."""
    from tests.engine.checkpoints import build_checkpoint

    model_dir = build_checkpoint(tmp_path / "ds", "kimi_k2")
    response = staff_client.post("/api/v1/models/", {"name": "tiny-kimi", "source": str(model_dir)}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["architecture"] == "DeepseekV3ForCausalLM"


@pytest.mark.parametrize("source,message", [("nonexistent/dir", "not a directory"), ("", "no config.json")])
def test_register_broken_directory_is_400_naming_the_field(staff_client, tmp_path, source, message):
    response = staff_client.post("/api/v1/models/", {"name": "bad", "source": str(tmp_path / source)}, format="json")
    assert response.status_code == 400
    assert message in response.json()["source"][0]


def test_register_unsupported_architecture(staff_client, model_dir, tmp_path):
    import json
    import shutil

    target = tmp_path / "gpt2"
    shutil.copytree(model_dir, target)
    cfg = json.loads((target / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (target / "config.json").write_text(json.dumps(cfg))
    response = staff_client.post("/api/v1/models/", {"name": "gpt2", "source": str(target)}, format="json")
    assert response.status_code == 400 and "GPT2LMHeadModel" in response.json()["source"][0]


def _with_quantization(model_dir, target, quant):
    import json
    import shutil

    shutil.copytree(model_dir, target)
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**cfg, "quantization_config": quant}))
    return target


@pytest.mark.parametrize(
    ("quant", "message"),
    [({"quant_method": "awq", "bits": 4}, "quant_method 'awq'"), ({"quant_method": "fp8"}, "per-tensor fp8")],
)
def test_register_unsupported_quantization_is_400_naming_it(staff_client, model_dir, tmp_path, quant, message):
    target = _with_quantization(model_dir, tmp_path / "q", quant)
    response = staff_client.post("/api/v1/models/", {"name": "q", "source": str(target)}, format="json")
    assert response.status_code == 400 and message in response.json()["source"][0]


def test_register_int4_checkpoint_counts_packed_parameters(staff_client, model_dir, tmp_path):
    from workers.bench.quant_checkpoints import int4_config, write_quantized

    dense = staff_client.post("/api/v1/models/", {"name": "d", "source": str(model_dir)}, format="json").json()
    qdir, _ = write_quantized(model_dir, tmp_path / "q", tmp_path / "twin", int4_config())
    response = staff_client.post("/api/v1/models/", {"name": "q", "source": str(qdir)}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["parameter_count"] == dense["parameter_count"]


def test_missing_field_is_named(staff_client):
    response = staff_client.post("/api/v1/deployments/", {"slug": "x"}, format="json")
    assert response.status_code == 400
    assert "model" in response.json()


def test_unknown_ids_are_404(staff_client):
    assert staff_client.get("/api/v1/deployments/nope/").status_code == 404
    assert staff_client.get("/api/v1/models/999999/").status_code == 404
    assert staff_client.post("/api/v1/deployments/nope/start/").status_code == 404


@pytest.fixture
def model(model_dir):
    from controlplane.catalog.services import register_model

    return register_model(name="tiny", source=str(model_dir))


def test_disaggregated_needs_both_roles(staff_client, model):
    response = staff_client.post(
        "/api/v1/deployments/",
        {"slug": "pd", "model": "tiny", "mode": "disaggregated", "prefill_replicas": 1},
        format="json",
    )
    assert response.status_code == 400 and "decode_replicas" in response.json()


def test_pagination(staff_client, model):
    for i in range(5):
        staff_client.post("/api/v1/cache-policies/", {"name": f"p{i}"}, format="json")
    page = staff_client.get("/api/v1/cache-policies/?page_size=2").json()
    assert page["count"] == 5 and len(page["results"]) == 2 and page["next"]
    assert staff_client.get("/api/v1/cache-policies/?page=3&page_size=2").json()["results"][0]["name"] == "p4"


def test_deployment_lifecycle_through_reconciler(staff_client, model, node):
    created = staff_client.post("/api/v1/deployments/", {"slug": "demo", "model": "tiny", "replicas": 2}, format="json")
    assert created.status_code == 201
    reconcile_all()
    replicas = Replica.objects.filter(deployment__slug="demo")
    assert replicas.count() == 2 and {r.state for r in replicas} == {"pending"}
    assert {r.node.name for r in replicas} == {"node-a"}
    # Each CUDA device hosts one replica.
    assert sorted(d.index for r in replicas for d in r.devices.all()) == [0, 1]
    reconcile_all()
    assert replicas.count() == 2  # idempotent

    scaled = staff_client.post("/api/v1/deployments/demo/scale/", {"replicas": 1}, format="json")
    assert scaled.status_code == 200 and scaled.json()["replicas"] == 1
    reconcile_all()
    assert replicas.filter(state="draining").count() == 1

    stopped = staff_client.post("/api/v1/deployments/demo/stop/")
    assert stopped.json()["desired_state"] == "stopped"
    reconcile_all()
    assert not replicas.filter(state__in=Replica.ACTIVE_STATES).exists()
    verbs = set(Event.objects.values_list("verb", flat=True))
    assert {
        "deployment.created",
        "deployment.updated",
        "deployment.stop",
        "replica.pending",
        "replica.draining",
    } <= verbs


def test_restart_replaces_replicas_with_a_new_generation(staff_client, model, node):
    staff_client.post("/api/v1/deployments/", {"slug": "demo", "model": "tiny"}, format="json")
    reconcile_all()
    first = Replica.objects.get()
    assert staff_client.post("/api/v1/deployments/demo/restart/").json()["generation"] == 2
    reconcile_all()
    first.refresh_from_db()
    assert first.state == "draining"
    assert Replica.objects.filter(generation=2, state="pending").count() == 1


def test_drain_one_replica(staff_client, model, node):
    staff_client.post("/api/v1/deployments/", {"slug": "demo", "model": "tiny"}, format="json")
    reconcile_all()
    r = Replica.objects.get()
    response = staff_client.post("/api/v1/deployments/demo/drain/", {"replica": r.pk}, format="json")
    assert response.status_code == 200 and response.json()[0]["state"] == "draining"
    bad = staff_client.post("/api/v1/deployments/demo/drain/", {"replica": 12345}, format="json")
    assert bad.status_code == 400 and "replica" in bad.json()


def test_replica_state_machine_refuses_illegal_moves(model, node):
    dep = Deployment.objects.create(slug="demo", model=model)
    r = Replica.objects.create(deployment=dep, node=node)
    assert transition_replica(r.pk, "ready") is None  # pending → ready skips starting
    assert transition_replica(r.pk, "starting", pid=123).state == "starting"
    assert transition_replica(r.pk, "failed", last_error="boom").state == "failed"
    assert transition_replica(r.pk, "starting") is None  # failed is terminal


def test_repeated_failures_stop_the_reconciler_from_churning(model, node):
    dep = Deployment.objects.create(slug="demo", model=model)
    for _ in range(3):
        reconcile_all()
        r = Replica.objects.get(deployment=dep, state="pending")
        transition_replica(r.pk, "failed", last_error="crash")
    reconcile_all()
    assert not Replica.objects.filter(state="pending").exists()


def test_node_going_stale_stops_its_replicas(model, node, settings):
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.inventory.models import Node
    from controlplane.inventory.services import mark_stale_nodes_offline

    Deployment.objects.create(slug="demo", model=model)
    reconcile_all()
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=5))
    assert [n.name for n in mark_stale_nodes_offline()] == ["node-a"]
    replica = Replica.objects.get()
    # Stopped, not failed: the node went away, and the deployment's failure budget is untouched.
    assert replica.state == "stopped" and "stopped heartbeating" in replica.last_error


def test_api_key_secret_shown_once_and_hashed(staff_client, staff, model):
    Deployment.objects.create(slug="demo", model=model)
    response = staff_client.post(
        "/api/v1/api-keys/", {"name": "app", "allowed_deployments": ["demo"], "rpm_limit": 60}, format="json"
    )
    assert response.status_code == 201
    secret = response.json()["secret"]
    key = ApiKey.objects.get()
    assert secret.startswith(key.prefix) and secret not in key.hashed_secret
    assert authenticate(secret) == key
    detail = staff_client.get(f"/api/v1/api-keys/{key.pk}/").json()
    assert "secret" not in detail and detail["allowed_deployments"] == ["demo"]
    assert staff_client.post(f"/api/v1/api-keys/{key.pk}/revoke/").json()["revoked"] is True
    assert authenticate(secret) is None


def test_users_see_only_their_own_keys(staff_client, user_client, user):
    from controlplane.gateway.services import create_api_key

    create_api_key(name="mine", owner=user)
    staff_client.post("/api/v1/api-keys/", {"name": "staff-key"}, format="json")
    assert [k["name"] for k in user_client.get("/api/v1/api-keys/").json()["results"]] == ["mine"]
    assert staff_client.get("/api/v1/api-keys/").json()["count"] == 2


def test_filtering(staff_client, model):
    Deployment.objects.create(slug="a", model=model)
    Deployment.objects.create(slug="b", model=model, desired_state="stopped")
    body = staff_client.get("/api/v1/deployments/?desired_state=stopped").json()
    assert [d["slug"] for d in body["results"]] == ["b"]


def test_healthz_reports_db_and_redis(client):
    body = client.get("/healthz").json()
    assert body == {"status": "ok", "database": "ok", "redis": "ok"}


def test_create_token_command(staff, capsys):
    from django.core.management import call_command

    call_command("create_token", "ops")
    token = capsys.readouterr().out.strip()
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert client.get("/api/v1/models/").status_code == 200
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no user named"):
        call_command("create_token", "ghost")
