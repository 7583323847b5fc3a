"""What the deployments app tells others, each after the transaction commits or at once: node
agents (start or stop a replica: a Celery task on the node's queue, by name, as the agents
know it), the reconciler (the `deployments.reconcile` task, by name) and live clients (publish).

Below the state machine, the reconciler and the actions, which all send through here; the tasks
module is not imported (its tasks import those modules), the tasks are sent by their names
through the Celery app that the Django settings load (`controlplane.config`).
"""

from __future__ import annotations

from celery import current_app
from django.db import transaction

from controlplane.deployments.models import Deployment, Replica
from controlplane.deployments.replica_specs import build_spec
from controlplane.events.broadcast import publish
from workers.protocol import control

RECONCILE_TASK = "deployments.reconcile"  # tasks.reconcile's name (the beat schedule's too)
CONTROL_QUEUE = "control"


def send_start(replica: Replica) -> None:
    """Ask the replica's node agent to start it, from a spec built now (after commit)."""
    spec = build_spec(replica).to_wire()
    send_after_commit(control.START_REPLICA, spec, replica.node.queue)


def send_stop(replica: Replica) -> None:
    send_after_commit(control.STOP_REPLICA, replica.pk, replica.node.queue)


def send_after_commit(task: str, arg, queue: str) -> None:
    transaction.on_commit(lambda: current_app.send_task(task, args=[arg], queue=queue))


def schedule_reconcile() -> None:
    """A reconcile pass after commit (the `deployments.reconcile` task, by its name)."""
    transaction.on_commit(lambda: current_app.send_task(RECONCILE_TASK, queue=CONTROL_QUEUE))


def publish_deployment(dep: Deployment, **extra) -> None:
    publish("deployment", {"slug": dep.slug, "desired_state": dep.desired_state, "generation": dep.generation, **extra})


def publish_replica(r: Replica) -> None:
    publish(
        "replica",
        {
            "id": r.pk,
            "deployment": r.deployment.slug,
            "role": r.role,
            "state": r.state,
            "node": r.node.name if r.node else None,
            "restart_count": r.restart_count,
        },
    )
