"""A replica that cannot be placed shows on its deployment, with the reason, and in one event
per episode, instead of only in a log line."""

import pytest

from controlplane.catalog.services import register_model
from controlplane.deployments.models import Replica
from controlplane.deployments.reconciler import reconcile_all
from controlplane.events.models import Event
from controlplane.inventory.models import Node
from controlplane.inventory.services import register_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def model():
    return register_model(name="tiny", source="org/tiny", source_type="hub")


def _cpu_node(name: str) -> Node:
    return register_node(name=name, hostname=name, devices=[{"index": 0, "kind": "cpu", "name": "cpu"}])


def test_a_replica_that_cannot_be_placed_shows_on_the_deployment_once(staff_client, model, settings):
    settings.SWITCHYARD = {**settings.SWITCHYARD, "CPU_REPLICAS_PER_DEVICE": 1}
    staff_client.post("/api/v1/deployments/", {"slug": "d", "model": "tiny", "replicas": 2}, format="json")
    reconcile_all()
    body = staff_client.get("/api/v1/deployments/d/").json()
    assert body["placement_error"] == "2 replicas not placed: no online node"

    _cpu_node("node-c")  # room for one of the two
    for _ in range(3):  # the state stays, the event is not repeated on every pass
        reconcile_all()
    body = staff_client.get("/api/v1/deployments/d/").json()
    assert body["placement_error"] == (
        "1 replica not placed: no online node has room for a replica (1 device): node-c: 0 of 1 healthy devices free"
    )
    unplaced = Event.objects.filter(verb="deployment.unplaced", object_id=str(body["id"]))
    assert unplaced.count() == 1 and "no online node" in unplaced.get().data["reason"]

    other = _cpu_node("node-d")  # room for the second
    reconcile_all()
    assert staff_client.get("/api/v1/deployments/d/").json()["placement_error"] == ""
    placed = Event.objects.get(verb="deployment.placed", object_id=str(body["id"]))
    assert placed.data["was"].startswith("1 replica not placed")
    reconcile_all()
    assert Event.objects.filter(verb__in=["deployment.placed", "deployment.unplaced"]).count() == 2

    # Unplaced again later (node-d went away with its replica): a new episode, a new event.
    Replica.objects.filter(node=other).update(state=Replica.State.FAILED)
    Node.objects.filter(pk=other.pk).update(status=Node.Status.OFFLINE)
    reconcile_all()
    assert Event.objects.filter(verb="deployment.unplaced").count() == 2
    assert staff_client.get("/api/v1/deployments/d/").json()["placement_error"].startswith("1 replica not placed")


def test_a_node_left_online_with_a_stale_heartbeat_gets_no_replica(staff_client, model, settings):
    """An agent killed outright leaves its node `online` until the stale-node check runs; the
    reconciler must not place a replica there in the meantime (it would only be stopped again)."""
    from datetime import timedelta

    from django.utils import timezone

    staff_client.post("/api/v1/deployments/", {"slug": "d", "model": "tiny", "replicas": 1}, format="json")
    dead = _cpu_node("node-dead")
    old = timezone.now() - timedelta(seconds=settings.SWITCHYARD["NODE_STALE_SECONDS"] + 5)
    Node.objects.filter(pk=dead.pk).update(last_heartbeat=old)
    reconcile_all()
    assert not Replica.objects.exists()
    assert (
        staff_client.get("/api/v1/deployments/d/").json()["placement_error"] == "1 replica not placed: no online node"
    )
    alive = _cpu_node("node-alive")
    reconcile_all()
    assert list(Replica.objects.values_list("node__name", flat=True)) == [alive.name]
