from celery import shared_task
from django.db import OperationalError

from controlplane.deployments import node_sync
from controlplane.deployments.messaging import CONTROL_QUEUE, RECONCILE_TASK
from controlplane.deployments.reconciler import reconcile_all
from workers.protocol.control import NODE_REPORT, REPLICA_EVENT, NodeReport, ProtocolError, ReplicaEvent

# A pass that the database aborted (a deadlock victim, a dropped connection) runs again: both
# tasks are idempotent (an event older than the replica's last is ignored), and a lost pass
# would leave a stop or a start undone until the next beat, or for good without one.
RETRY = {"autoretry_for": (OperationalError,), "retry_backoff": 1, "retry_backoff_max": 5, "max_retries": 8}


@shared_task(name=RECONCILE_TASK, queue=CONTROL_QUEUE, **RETRY)  # "deployments.reconcile"
def reconcile() -> dict:
    """Idempotent: safe to run any number of times, from beat or after any change."""
    return reconcile_all()


@shared_task(name=REPLICA_EVENT, queue="control", **RETRY)
def replica_event(message: dict) -> str:
    """A node agent's report of one replica process (started, ready, exited, failed, stopped)."""
    try:
        event = ReplicaEvent.from_wire(message)
    except ProtocolError as exc:
        return f"unreadable: {exc}"
    moved = node_sync.apply_replica_event(event)
    return f"replica {event.replica_id}: {event.kind} -> {moved.state if moved else 'unchanged'}"


@shared_task(name=NODE_REPORT, queue="control")
def node_report(message: dict) -> dict | str:
    """A node agent's heartbeat: its devices and the replicas it runs."""
    try:
        report = NodeReport.from_wire(message)
    except ProtocolError as exc:
        return f"unreadable: {exc}"
    return node_sync.apply_node_report(report)
