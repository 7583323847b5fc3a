"""The control worker's side of the agent protocol: replica events and node reports applied to
the database, and the messages it sends to a node's queue (read back from the real broker)."""

import base64
import json
import time
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from controlplane.catalog.services import register_model
from controlplane.deployments.models import Deployment, Replica
from controlplane.deployments.node_sync import apply_node_report, apply_replica_event
from controlplane.deployments.reconciler import reconcile_all
from controlplane.events.models import Event
from controlplane.inventory.models import Node
from workers.protocol.control import (
    START_REPLICA,
    STOP_REPLICA,
    NodeReport,
    ProtocolError,
    ReplicaEvent,
    ReplicaReport,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def broker():
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete("node.node-a", "node.node-b", "control")
    return client


def sent(broker, queue: str = "node.node-a") -> list[tuple[str, object]]:
    """(task, first argument) of every message waiting on `queue`, oldest first; drained."""
    out = []
    for raw in reversed(broker.lrange(queue, 0, -1)):  # LPUSH: the newest is first
        message = json.loads(raw)
        args = json.loads(base64.b64decode(message["body"]))[0]
        out.append((message["headers"]["task"], args[0] if args else None))
    broker.delete(queue)
    return out


@pytest.fixture
def replica(node, model_dir, broker, django_capture_on_commit_callbacks):
    """A pending replica on node-a, placed by the reconciler (its start message drained)."""
    model = register_model(name="tiny", source=str(model_dir))
    Deployment.objects.create(slug="demo", model=model)
    with django_capture_on_commit_callbacks(execute=True):
        reconcile_all()
    sent(broker)
    return Replica.objects.get()


def event(r, kind, **fields) -> ReplicaEvent:
    return ReplicaEvent(replica_id=r.pk, kind=kind, node="node-a", **fields)


def test_the_reconciler_sends_a_self_contained_spec(node, model_dir, broker, django_capture_on_commit_callbacks):
    model = register_model(name="tiny", source=str(model_dir))
    Deployment.objects.create(slug="demo", model=model, max_num_seqs=8)
    with django_capture_on_commit_callbacks(execute=True):
        reconcile_all()
    [(task, spec)] = sent(broker)
    r = Replica.objects.get()
    assert task == START_REPLICA
    assert spec["replica_id"] == r.pk and spec["model_dir"] == str(model_dir) and spec["deployment"] == "demo"
    assert spec["max_num_seqs"] == 8 and spec["device"] == "cuda" and spec["cuda_devices"] == [0]


def test_events_move_the_replica_and_a_late_one_is_ignored(replica):
    started = event(replica, "started", pid=41)
    ready = event(replica, "ready", pid=41, status={"load": {"running": 0}, "endpoint": {"pid": 41}})
    # Delivered out of order: ready first (through starting), then the older started.
    assert apply_replica_event(ready).state == "ready"
    assert apply_replica_event(started) is None
    r = Replica.objects.get()
    assert (r.state, r.pid, r.load, r.endpoint) == ("ready", 41, {"running": 0}, {"pid": 41})
    assert [e.verb for e in Event.objects.filter(verb__startswith="replica.").order_by("id")][-2:] == [
        "replica.starting",
        "replica.ready",
    ]


def test_a_crash_makes_the_replica_unroutable_until_it_is_ready_again(replica):
    apply_replica_event(event(replica, "ready", pid=41))
    crashed = apply_replica_event(
        event(
            replica,
            "exited",
            exit_code=-9,
            error="replica process exited with code -9",
            log_tail="boom",
            restart_count=1,
        )
    )
    assert (crashed.state, crashed.pid, crashed.restart_count) == ("starting", None, 1)
    assert crashed.last_error == "replica process exited with code -9" and crashed.log_tail == "boom"
    assert apply_replica_event(event(replica, "started", pid=42, restart_count=1)).pid == 42
    assert apply_replica_event(event(replica, "ready", pid=42, restart_count=1)).state == "ready"


def test_given_up_is_failed_and_stopped_is_stopped(replica, node, model_dir):
    failed = apply_replica_event(event(replica, "failed", error="gave up after 5 restarts", restart_count=5))
    assert (failed.state, failed.last_error, failed.restart_count) == ("failed", "gave up after 5 restarts", 5)
    other = Replica.objects.create(deployment=replica.deployment, node=node)
    assert apply_replica_event(event(other, "stopped", log_tail="drained")).state == "stopped"


def test_a_process_the_control_plane_ended_is_told_to_stop(replica, broker, django_capture_on_commit_callbacks):
    apply_replica_event(event(replica, "failed", error="x"))
    with django_capture_on_commit_callbacks(execute=True):
        assert apply_replica_event(event(replica, "started", pid=50)) is None
    assert sent(broker) == [(STOP_REPLICA, replica.pk)]
    assert Replica.objects.get().state == "failed"


def test_an_event_from_another_node_changes_nothing(replica, broker, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        assert apply_replica_event(ReplicaEvent(replica_id=replica.pk, kind="started", node="node-b", pid=9)) is None
    assert Replica.objects.get().state == "pending"
    assert sent(broker, "node.node-b") == [(STOP_REPLICA, replica.pk)]


def test_node_report_registers_a_new_node_and_refreshes_a_known_one():
    devices = [{"index": 0, "kind": "cpu", "name": "cpu", "memory_total": 100, "memory_used": 10}]
    apply_node_report(NodeReport(node="fresh", hostname="h", devices=devices))
    node = Node.objects.get(name="fresh")
    assert node.status == "online" and node.queue == "node.fresh" and node.devices.get().memory_used == 10
    first = node.last_heartbeat
    apply_node_report(NodeReport(node="fresh", devices=[{**devices[0], "memory_used": 50}]))
    node.refresh_from_db()
    assert node.last_heartbeat > first and node.devices.get().memory_used == 50
    assert Event.objects.filter(verb="node.registered").count() == 1


def test_node_report_mirrors_load_and_log_of_the_replicas_it_runs(replica):
    apply_replica_event(event(replica, "ready", pid=41))
    report = NodeReport(
        node="node-a",
        replicas=[ReplicaReport(replica.pk, "ready", pid=41, status={"load": {"running": 3}}, log_tail="line 1")],
    )
    assert apply_node_report(report) == {"lost": [], "stopped": [], "resent": []}
    r = Replica.objects.get()
    assert r.load == {"running": 3} and r.log_tail == "line 1" and r.state == "ready"


def test_a_report_older_than_the_replicas_last_event_does_not_overwrite_what_it_wrote(replica):
    """A node report and a replica event are applied by two control worker threads: the report,
    made before the event, must not put back the log tail and load the event replaced."""
    report = NodeReport(
        node="node-a",
        replicas=[ReplicaReport(replica.pk, "ready", pid=41, status={"load": {"running": 3}}, log_tail="starting")],
    )
    apply_replica_event(event(replica, "ready", pid=41, status={"load": {"running": 0}}))
    Replica.objects.filter(pk=replica.pk).update(state="draining")  # stopping: still live
    apply_replica_event(event(replica, "exited", error="drained", log_tail="starting\ndrained and stopped"))
    apply_node_report(report)
    r = Replica.objects.get()
    assert r.log_tail == "starting\ndrained and stopped" and r.load == {"running": 0}
    newer = NodeReport(node="node-a", replicas=[ReplicaReport(replica.pk, "draining", pid=41, log_tail="later")])
    apply_node_report(newer)
    assert Replica.objects.get().log_tail == "later"  # a report made after the event applies


def test_a_replica_the_agent_no_longer_runs_is_stopped_not_failed(replica, broker, django_capture_on_commit_callbacks):
    apply_replica_event(event(replica, "ready", pid=41))
    stale = NodeReport(node="node-a", at_ns=time.time_ns() - 10**9, replicas=[])  # made before the event
    assert apply_node_report(stale)["lost"] == []
    with django_capture_on_commit_callbacks(execute=True):
        assert apply_node_report(NodeReport(node="node-a", replicas=[]))["lost"] == [replica.pk]
    lost = Replica.objects.get(pk=replica.pk)
    assert lost.state == "stopped" and "does not run it" in lost.last_error
    # A reconcile was asked for at once; it replaces the replica, and nothing counts against
    # the deployment's failure budget.
    assert "deployments.reconcile" in [t for t, _ in sent(broker, "control")]
    reconcile_all()
    assert Replica.objects.filter(state="pending").exclude(pk=replica.pk).count() == 1
    assert not Replica.objects.filter(state="failed").exists()


def test_a_pending_replica_is_resent_once_its_start_looks_lost(replica, broker, django_capture_on_commit_callbacks):
    report = NodeReport(node="node-a", replicas=[])
    assert apply_node_report(report)["resent"] == []  # just placed: its start message is on the way
    Replica.objects.filter(pk=replica.pk).update(created_at=timezone.now() - timedelta(minutes=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert apply_node_report(NodeReport(node="node-a"))["resent"] == [replica.pk]
        assert apply_node_report(NodeReport(node="node-a"))["resent"] == []  # at most once per 30 s
    [(task, spec)] = sent(broker)
    assert task == START_REPLICA and spec["replica_id"] == replica.pk
    assert Replica.objects.get().state == "pending"


def test_a_replica_the_database_does_not_know_is_told_to_stop(node, broker, django_capture_on_commit_callbacks):
    report = NodeReport(node="node-a", replicas=[ReplicaReport(999_999, "ready", pid=7)])
    with django_capture_on_commit_callbacks(execute=True):
        assert apply_node_report(report)["stopped"] == [999_999]
    assert sent(broker) == [(STOP_REPLICA, 999_999)]


def test_unreadable_messages_are_refused_clearly():
    with pytest.raises(ProtocolError, match="newer"):
        ReplicaEvent.from_wire({"replica_id": 1, "kind": "started", "node": "a", "version": 99})
    with pytest.raises(ProtocolError, match="unknown replica event kind"):
        ReplicaEvent.from_wire({"replica_id": 1, "kind": "exploded", "node": "a"})
    with pytest.raises(ProtocolError):
        NodeReport.from_wire({"hostname": "no node name"})
    wire = NodeReport(node="a", replicas=[ReplicaReport(1, "ready")]).to_wire()
    assert NodeReport.from_wire(json.loads(json.dumps(wire))).replicas[0] == ReplicaReport(1, "ready")


def test_a_leaving_agent_takes_its_node_offline_and_a_late_report_does_not_bring_it_back(node):
    earlier = NodeReport(node="node-a")  # made before the agent left, delivered after
    apply_node_report(NodeReport(node="node-a", leaving=True))
    assert Node.objects.get(name="node-a").status == "offline"
    assert Event.objects.filter(verb="node.offline").count() == 1
    apply_node_report(earlier)
    assert Node.objects.get(name="node-a").status == "offline"
    apply_node_report(NodeReport(node="node-a"))  # the agent is back
    assert Node.objects.get(name="node-a").status == "online"


def test_a_new_agent_is_placed_on_only_after_its_report(node, model_dir):
    """A node whose agent left gets no replica until it reports again."""
    apply_node_report(NodeReport(node="node-a", leaving=True))
    model = register_model(name="tiny", source=str(model_dir))
    Deployment.objects.create(slug="demo", model=model)
    assert reconcile_all()["demo"]["unplaced"] == 1
    apply_node_report(NodeReport(node="node-a", devices=[{"index": 0, "kind": "cpu", "name": "cpu"}]))
    assert reconcile_all()["demo"]["started"]


def test_a_replica_turning_ready_or_ending_asks_for_a_reconcile_at_once(
    replica, node, broker, django_capture_on_commit_callbacks
):
    """A replacement turning ready lets an outgoing replica drain, and an ended replica is to be
    replaced: neither waits for the periodic pass. A move that gives the reconciler nothing to
    do (starting) asks for none."""

    def reconciles(apply) -> int:
        with django_capture_on_commit_callbacks(execute=True):
            apply()
        return [t for t, _ in sent(broker, "control")].count("deployments.reconcile")

    assert reconciles(lambda: apply_replica_event(event(replica, "started", pid=41))) == 0
    assert reconciles(lambda: apply_replica_event(event(replica, "ready", pid=41))) == 1
    assert reconciles(lambda: apply_replica_event(event(replica, "ready", pid=41))) == 0  # no move: nothing new
    assert reconciles(lambda: apply_replica_event(event(replica, "stopped"))) == 1
    other = Replica.objects.create(deployment=replica.deployment, node=node)
    assert reconciles(lambda: apply_replica_event(event(other, "failed", error="x"))) == 1


def test_a_node_coming_online_asks_for_a_reconcile_at_once(node, broker, django_capture_on_commit_callbacks):
    """Replicas waiting for a node (`make run` creates the demo deployment before its agent is
    up) are placed when the node registers or comes back, not at the next periodic pass; a
    heartbeat of a node already online asks for none."""
    devices = [{"index": 0, "kind": "cpu", "name": "cpu"}]

    def reconciles(report: NodeReport) -> int:
        with django_capture_on_commit_callbacks(execute=True):
            apply_node_report(report)
        return [t for t, _ in sent(broker, "control")].count("deployments.reconcile")

    assert reconciles(NodeReport(node="node-new", devices=devices)) == 1  # registered
    assert reconciles(NodeReport(node="node-new", devices=devices)) == 0  # a heartbeat
    apply_node_report(NodeReport(node="node-new", leaving=True))
    assert reconciles(NodeReport(node="node-new", devices=devices)) == 1  # back online
