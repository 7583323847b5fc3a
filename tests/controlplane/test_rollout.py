"""The reconciler's rollouts and failure budget, on a registered node, with replica states moved
by hand through `transition_replica` as agents would report them: restart and drain start the
replacement before the old replica drains (max_surge), scale-down drains the least loaded, the
failure budget resets after a healthy period, and a deployment that has given up is visible,
recorded once and answered with a 503 that tells the client an operator must act."""

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.catalog.services import register_model
from controlplane.deployments.models import Deployment, Replica
from controlplane.deployments.reconciler import reconcile_all
from controlplane.deployments.replica_states import transition_replica
from controlplane.deployments.services import create_deployment
from controlplane.events.models import Event
from controlplane.gateway.services import create_api_key
from controlplane.inventory.services import register_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def model():
    return register_model(name="tiny", source="org/tiny", source_type="hub")


def _node(name: str = "node-r", gpus: int = 6):
    devices = [{"index": i, "kind": "cuda", "name": "H200", "memory_total": 141 << 30} for i in range(gpus)]
    return register_node(name=name, hostname=name, devices=devices)


def _deploy(model, replicas: int = 1, **fields) -> Deployment:
    return create_deployment({"slug": "d", "model": model, "replicas": replicas, **fields})


def _ready(r: Replica, load: dict | None = None) -> Replica:
    """What the agent's `started` then `ready` reports do to the row."""
    transition_replica(r.pk, "starting", pid=1000 + r.pk)
    return transition_replica(r.pk, "ready", **({"load": load} if load is not None else {}))


def _states(dep: Deployment) -> dict[int, tuple[int, str]]:
    return {r.pk: (r.generation, r.state) for r in dep.replica_set.order_by("pk")}


def _pending(dep: Deployment) -> list[Replica]:
    return list(dep.replica_set.filter(state="pending").order_by("pk"))


def _fail(r: Replica) -> None:
    assert transition_replica(r.pk, "failed", last_error="crashed") is not None


# -- restart and drain roll ---------------------------------------------------------------------
def test_restart_keeps_the_old_replica_until_a_new_one_is_ready_then_drains_it(staff_client, model):
    _node()
    dep = _deploy(model)
    reconcile_all()
    old = _ready(_pending(dep)[0])

    assert staff_client.post("/api/v1/deployments/d/restart/").json()["generation"] == 2
    reconcile_all()
    (new,) = _pending(dep)
    assert new.generation == 2
    assert _states(dep)[old.pk] == (1, "ready")  # still serving

    reconcile_all()  # a surge of one: nothing more starts, the old one stays
    transition_replica(new.pk, "starting", pid=2000)
    reconcile_all()
    assert _states(dep) == {old.pk: (1, "ready"), new.pk: (2, "starting")}

    transition_replica(new.pk, "ready")
    reconcile_all()
    assert _states(dep) == {old.pk: (1, "draining"), new.pk: (2, "ready")}
    drained = Event.objects.get(verb="replica.draining", object_id=str(old.pk))
    assert drained.data["reason"] == "restart"


def test_rolling_restart_never_has_fewer_ready_replicas_than_desired(model):
    _node()
    dep = _deploy(model, replicas=3)
    reconcile_all()
    for r in _pending(dep):
        _ready(r)
    dep.refresh_from_db()
    from controlplane.deployments.services import restart

    restart(dep)
    for _ in range(10):
        reconcile_all()
        live = dep.replica_set.filter(state__in=Replica.ACTIVE_STATES)
        assert live.filter(state="ready").count() >= 3
        assert live.count() <= 4  # 3 + a surge of 1
        pending = _pending(dep)
        if not pending and not live.filter(generation=1).exists():
            break
        for r in pending:
            _ready(r)
    live = dep.replica_set.filter(state__in=Replica.ACTIVE_STATES)
    assert sorted(live.values_list("generation", "state")) == [(2, "ready")] * 3
    assert dep.replica_set.filter(generation=1, state="draining").count() == 3


def test_max_surge_zero_replaces_in_place(staff_client, model):
    _node()
    dep = _deploy(model, max_surge=0)
    reconcile_all()
    old = _ready(_pending(dep)[0])
    staff_client.post("/api/v1/deployments/d/restart/")
    reconcile_all()
    (new,) = _pending(dep)
    assert _states(dep) == {old.pk: (1, "draining"), new.pk: (2, "pending")}


def test_with_no_room_for_a_surge_replica_the_old_one_is_replaced_in_place(staff_client, model):
    node = _node(gpus=1)
    dep = _deploy(model)
    reconcile_all()
    old = _ready(_pending(dep)[0])
    staff_client.post("/api/v1/deployments/d/restart/")
    reconcile_all()
    assert _states(dep) == {old.pk: (1, "draining")}
    assert (
        "no room to start its replacement first"
        in (Event.objects.get(verb="replica.draining", object_id=str(old.pk)).data["reason"])
    )
    reconcile_all()  # its device is still taken while it drains: nothing more is let go
    assert _states(dep) == {old.pk: (1, "draining")}
    transition_replica(old.pk, "stopped")
    reconcile_all()
    (new,) = _pending(dep)
    assert new.generation == 2 and new.node == node


def test_draining_one_replica_starts_its_replacement_first(staff_client, model):
    _node()
    dep = _deploy(model, replicas=2)
    reconcile_all()
    first, second = (_ready(r) for r in _pending(dep))

    response = staff_client.post("/api/v1/deployments/d/drain/", {"replica": first.pk}, format="json")
    assert response.status_code == 200
    (body,) = response.json()
    assert body["id"] == first.pk and body["state"] == "ready" and body["drain_requested_at"]
    reconcile_all()
    (replacement,) = _pending(dep)
    assert _states(dep)[first.pk] == (1, "ready")

    _ready(replacement)
    reconcile_all()
    assert _states(dep) == {first.pk: (1, "draining"), second.pk: (1, "ready"), replacement.pk: (1, "ready")}
    reconcile_all()  # settled: two ready, nothing more started
    assert not _pending(dep)


def test_draining_a_replica_that_serves_nothing_yet_is_immediate(staff_client, model):
    _node()
    dep = _deploy(model)
    reconcile_all()
    (r,) = _pending(dep)
    response = staff_client.post("/api/v1/deployments/d/drain/", {"replica": r.pk}, format="json")
    assert response.json()[0]["state"] == "draining"


# -- scale-down -----------------------------------------------------------------------------------
def test_scale_down_drains_the_least_loaded_replicas(staff_client, model):
    _node()
    dep = _deploy(model, replicas=3)
    reconcile_all()
    oldest, middle, newest = _pending(dep)
    _ready(oldest, {"running": 0, "waiting": 1})
    _ready(middle, {"running": 5, "waiting": 2})
    _ready(newest, {"running": 2, "waiting": 0})
    # Neither "newest first" nor "oldest first" would keep the middle one.
    assert staff_client.post("/api/v1/deployments/d/scale/", {"replicas": 1}, format="json").status_code == 200
    reconcile_all()
    assert _states(dep) == {oldest.pk: (1, "draining"), middle.pk: (1, "ready"), newest.pk: (1, "draining")}


def test_scale_down_lets_go_of_a_replica_still_starting_before_a_ready_one(model):
    _node()
    dep = _deploy(model, replicas=2)
    reconcile_all()
    busy, starting = _pending(dep)
    _ready(busy, {"running": 9, "waiting": 9})
    transition_replica(starting.pk, "starting", pid=4242)
    Deployment.objects.filter(pk=dep.pk).update(replicas=1)
    reconcile_all()
    assert _states(dep) == {busy.pk: (1, "ready"), starting.pk: (1, "draining")}


# -- failure budget -----------------------------------------------------------------------------
def _fail_next(dep: Deployment) -> None:
    reconcile_all()
    (r,) = _pending(dep)
    _fail(r)


def _earlier(replicas, field: str, seconds: float) -> None:
    replicas.update(**{field: timezone.now() - timedelta(seconds=seconds)})


def _two_failures_then_ready_for(model, seconds: float) -> tuple[Deployment, Replica]:
    """Two replicas of a one-replica deployment failed, the third has been ready for `seconds`
    (the clock is moved back instead of waiting), the failures before that; reconciled."""
    _node()
    dep = _deploy(model)
    _fail_next(dep)
    _fail_next(dep)
    reconcile_all()
    (replica,) = _pending(dep)
    _ready(replica)
    _earlier(dep.replica_set.filter(state="failed"), "stopped_at", 400)
    _earlier(Replica.objects.filter(pk=replica.pk), "ready_at", seconds)
    reconcile_all()
    return dep, replica


def test_failure_budget_resets_after_a_replica_was_ready_for_the_healthy_period(model, settings):
    settings.SWITCHYARD = {**settings.SWITCHYARD, "REPLICA_HEALTHY_SECONDS": 300}
    dep, steady = _two_failures_then_ready_for(model, 301)
    dep.refresh_from_db()
    assert dep.failure_budget_reset_at is not None
    _fail(steady)
    # Four failures in this generation, two since it was last healthy: it keeps going.
    _fail_next(dep)
    reconcile_all()
    dep.refresh_from_db()
    assert dep.failed_at is None and len(_pending(dep)) == 1
    # A third failure since the reset spends the budget.
    _fail(_pending(dep)[0])
    reconcile_all()
    dep.refresh_from_db()
    assert dep.failed_at is not None and not _pending(dep)


def test_a_replica_ready_for_less_than_the_healthy_period_does_not_reset_the_budget(model, settings):
    settings.SWITCHYARD = {**settings.SWITCHYARD, "REPLICA_HEALTHY_SECONDS": 300}
    dep, brief = _two_failures_then_ready_for(model, 200)
    _fail(brief)
    reconcile_all()
    dep.refresh_from_db()
    assert dep.failure_budget_reset_at is None
    assert dep.failed_at is not None and not _pending(dep)


# -- a deployment that has given up ---------------------------------------------------------------
@pytest.fixture
def api_key(django_user_model) -> str:
    return create_api_key(name="rollout", owner=django_user_model.objects.create_user("rollout-owner"))[1]


def _chat(client, api_key):
    body = {"model": "d", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return client.post(
        "/v1/chat/completions", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {api_key}"
    )


def test_a_deployment_that_gave_up_is_failed_once_and_the_gateway_says_an_operator_must_restart_it(
    staff_client, client, api_key, model
):
    _node()
    dep = _deploy(model)
    # Before giving up, no replica is a passing condition: come back shortly.
    waiting = _chat(client, api_key)
    assert waiting.status_code == 503 and waiting.json()["error"]["code"] == "no_ready_replica"
    assert waiting["Retry-After"] == "2"
    for _ in range(3):
        _fail_next(dep)
    for _ in range(3):
        reconcile_all()
    body = staff_client.get("/api/v1/deployments/d/").json()
    assert body["status"] == "failed" and body["failed_at"]
    assert body["failed_reason"] == "3 replicas of generation 1 failed (the failure budget is 3)"
    assert staff_client.get("/api/v1/deployments/").json()["results"][0]["status"] == "failed"
    (event,) = Event.objects.filter(verb="deployment.failed")
    assert event.object_id == str(dep.pk) and event.data["failed_replicas"] == 3

    refused = _chat(client, api_key)
    assert refused.status_code == 503
    error = refused.json()["error"]
    assert error["code"] == "deployment_failed" and error["type"] == "service_unavailable"
    assert "an operator must restart it" in error["message"] and "/api/v1/deployments/d/restart/" in error["message"]
    assert "Retry-After" not in refused

    restarted = staff_client.post("/api/v1/deployments/d/restart/").json()
    assert restarted["status"] == "running" and restarted["failed_at"] is None and restarted["failed_reason"] == ""
    assert Event.objects.get(verb="deployment.restart").data["cleared_failure"] == event.data["reason"]
    reconcile_all()
    assert len(_pending(dep)) == 1
    assert _chat(client, api_key).json()["error"]["code"] == "no_ready_replica"


def test_start_clears_a_failure_and_gives_a_fresh_budget_without_replacing_ready_replicas(staff_client, model):
    _node()
    dep = _deploy(model, replicas=2)
    reconcile_all()
    serving, flaky = _pending(dep)
    _ready(serving)
    _fail(flaky)
    _fail_next(dep)
    _fail_next(dep)
    reconcile_all()
    assert staff_client.get("/api/v1/deployments/d/").json()["status"] == "failed"

    started = staff_client.post("/api/v1/deployments/d/start/").json()
    assert started["status"] == "running" and started["generation"] == 1
    reconcile_all()
    assert len(_pending(dep)) == 1 and _states(dep)[serving.pk] == (1, "ready")


def test_a_restart_whose_replicas_keep_failing_leaves_the_old_ones_serving(staff_client, model):
    _node()
    dep = _deploy(model)
    reconcile_all()
    old = _ready(_pending(dep)[0])
    staff_client.post("/api/v1/deployments/d/restart/")
    for _ in range(3):
        _fail_next(dep)
    for _ in range(2):
        reconcile_all()
    body = staff_client.get("/api/v1/deployments/d/").json()
    assert body["status"] == "failed" and "generation 2" in body["failed_reason"]
    assert _states(dep)[old.pk] == (1, "ready")
    assert Event.objects.filter(verb="deployment.failed").count() == 1
