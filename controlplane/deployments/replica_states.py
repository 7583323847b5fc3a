"""The replica state machine: `transition_replica` is the one writer of replica state (agents'
reports through node_sync, the reconciler, the actions), and TRANSITIONS the moves it allows.
Every move is an audit event and a live update; a move that gives the reconciler work
(RECONCILE_ON) asks for a reconcile pass after commit.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from controlplane.deployments.messaging import publish_replica, schedule_reconcile, send_stop
from controlplane.deployments.models import Deployment, Replica
from controlplane.events.services import record_event
from controlplane.inventory.models import Node

log = logging.getLogger(__name__)
State = Replica.State

# Allowed replica state changes; anything else is refused (and logged), never applied.
TRANSITIONS: dict[str, set[str]] = {
    State.PENDING: {State.STARTING, State.STOPPED, State.FAILED, State.DRAINING},
    State.STARTING: {State.READY, State.STARTING, State.DRAINING, State.STOPPED, State.FAILED},
    State.READY: {State.STARTING, State.DRAINING, State.STOPPED, State.FAILED},
    State.DRAINING: {State.STOPPED, State.FAILED},
    State.STOPPED: set(),
    State.FAILED: set(),
}
# Moves after which the reconciler has work at once rather than at its next periodic pass: a
# replacement turned ready (an outgoing replica can drain), or a replica ended (replace it).
RECONCILE_ON = (State.READY, State.STOPPED, State.FAILED)


def lock_replica(replica_id: int) -> Replica | None:
    """The replica, locked for update inside the caller's transaction, its deployment locked
    first. The reconciler locks a deployment and then its replicas; a replica event that locked
    the replica first and then touched its deployment (an event row, the failure budget) could
    wait on the reconciler while it waited on the event: Postgres then aborts one of them (a
    stop was lost so). One order everywhere, deployment then replica, never deadlocks."""
    deployment_id = Replica.objects.filter(pk=replica_id).values_list("deployment_id", flat=True).first()
    if deployment_id is None:
        return None
    Deployment.objects.select_for_update().filter(pk=deployment_id).first()
    locked = Replica.objects.select_for_update(of=("self",)).select_related("deployment", "node")
    return locked.filter(pk=replica_id).first()


def transition_replica(
    replica_id: int, state: str, *, actor_label: str = "agent", reason: str = "", **fields
) -> Replica | None:
    """Move a replica to `state` if the state machine allows it; returns it, or None if refused.
    Every replica state change goes through here (audit event, live update, timestamps, and a
    reconcile after commit when the move gives the reconciler work: RECONCILE_ON)."""
    with transaction.atomic():
        r = lock_replica(replica_id)
        if r is None:
            return None
        if state != r.state and state not in TRANSITIONS[r.state]:
            log.info("replica %s: refused %s -> %s", replica_id, r.state, state)
            return None
        now = timezone.now()
        previous = r.state
        r.state = state
        for key, value in fields.items():
            setattr(r, key, value)
        if state == State.STARTING and previous != State.STARTING:
            r.started_at = now
        if state == State.READY:
            r.ready_at = now
        if state in (State.STOPPED, State.FAILED):
            r.stopped_at = now
            r.pid = None
        r.save()
        if previous != state:
            record_event(
                f"replica.{state}",
                r,
                actor_label=actor_label,
                data={
                    "from": previous,
                    **({"reason": reason} if reason else {}),
                    **({"error": r.last_error} if state == State.FAILED else {}),
                },
            )
            publish_replica(r)
            if state in RECONCILE_ON:
                schedule_reconcile()
    return r


def stop_replica(r: Replica, reason: str) -> Replica | None:
    """Ask the replica's agent to drain and stop it; one on no node, or still pending on an
    offline node, has no process to stop and is marked stopped here."""
    unreachable = r.node is None or (
        r.state == State.PENDING and r.pid is None and r.node.status == Node.Status.OFFLINE
    )
    if unreachable:
        return transition_replica(r.pk, State.STOPPED, actor_label="reconciler", reason=reason, last_error=reason)
    stopped = transition_replica(r.pk, State.DRAINING, actor_label="reconciler", reason=reason)
    if stopped is not None:
        send_stop(stopped)
    return stopped


def stop_replicas_on_node(node: Node, reason: str) -> int:
    """A node went silent: its replicas count as stopped (not failed: the node, not the
    replica, went away, and a deployment's failure budget is for replicas that crash), so the
    reconciler places them elsewhere."""
    replicas = list(
        Replica.objects.select_related("deployment", "node").filter(node=node, state__in=Replica.LIVE_STATES)
    )
    for r in replicas:
        transition_replica(r.pk, State.STOPPED, actor_label="health-check", reason=reason, last_error=reason)
    return len(replicas)
