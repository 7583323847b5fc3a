"""What node agents report, applied to the database by the control worker (the agents never
touch it; see workers.protocol.control).

- A `ReplicaEvent` moves one replica through the state machine (`transition_replica`), unless
  a newer message about that replica was applied already (Celery may deliver out of order). An
  unexpected exit is also a `replica.crashed` event of its own (crashes.py).
- A `NodeReport` is the agent's heartbeat: it refreshes the node and its devices, mirrors each
  replica's load and log into its row, and compares what runs with what the database says. A
  replica the database thinks is live on the node but that the agent does not run was lost
  (the agent restarted and its process was gone): it is marked stopped so the reconciler
  replaces it, without counting against the deployment's failure budget. A replica the agent
  runs that the database has ended is told to stop. A pending replica the agent has not heard
  of is sent again after a while (its start message was lost). A report that says the agent
  is leaving takes the node offline at once, so nothing more is placed there.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from controlplane.common import redis as redis_client
from controlplane.deployments import crashes
from controlplane.deployments.messaging import send_after_commit, send_start
from controlplane.deployments.models import Replica
from controlplane.deployments.replica_states import lock_replica, transition_replica
from controlplane.inventory import services as inventory
from workers.protocol.control import STOP_REPLICA, NodeReport, ReplicaEvent, node_queue

log = logging.getLogger(__name__)
State = Replica.State
RESEND_START_AFTER = timedelta(seconds=30)


def _stop_on_node(node: str, replica_id: int, why: str) -> None:
    log.info("telling %s to stop replica %s: %s", node, replica_id, why)
    send_after_commit(STOP_REPLICA, replica_id, node_queue(node))


def _status_fields(status: dict) -> dict:
    return {key: status[key] for key in ("load", "endpoint", "progress") if isinstance(status.get(key), dict)}


def apply_replica_event(event: ReplicaEvent) -> Replica | None:
    """Apply one agent message; returns the replica if its state moved."""
    label = f"agent:{event.node}"
    with transaction.atomic():
        r = lock_replica(event.replica_id)  # its deployment first: the reconciler's order
        running = event.kind in ("started", "ready")
        if r is None or r.node is None or r.node.name != event.node:
            if running:
                _stop_on_node(event.node, event.replica_id, "not a replica of this node")
            return None
        if event.at_ns <= r.last_event_ns:
            log.info("replica %s: ignoring a late %r event", r.pk, event.kind)
            return None
        Replica.objects.filter(pk=r.pk).update(last_event_ns=event.at_ns)
        if r.state in (State.STOPPED, State.FAILED):
            if running:  # the control plane ended it: the process must not live on
                _stop_on_node(event.node, r.pk, f"the replica is {r.state}")
            return None
        common = {"restart_count": event.restart_count}
        if event.kind == "started":
            return transition_replica(r.pk, State.STARTING, actor_label=label, pid=event.pid, **common)
        if event.kind == "ready":
            if r.state == State.PENDING:
                transition_replica(r.pk, State.STARTING, actor_label=label, pid=event.pid, **common)
            return transition_replica(
                r.pk,
                State.READY,
                actor_label=label,
                pid=event.pid,
                last_heartbeat=timezone.now(),
                **_status_fields(event.status),
                **common,
            )
        tail = {"log_tail": event.log_tail} if event.log_tail else {}
        error = {"last_error": event.error} if event.error else {}
        if crashes.is_crash(event):  # its own event, before the move it causes (restart or give up)
            crashes.record_crash(r, event)
        if event.kind == "exited":  # restarting after its backoff: not routable meanwhile
            if r.state == State.DRAINING:
                Replica.objects.filter(pk=r.pk).update(pid=None, **tail, **error, **common)
                return None
            return transition_replica(
                r.pk, State.STARTING, actor_label=label, reason="crashed", pid=None, **tail, **error, **common
            )
        if event.kind == "failed":
            return transition_replica(r.pk, State.FAILED, actor_label=label, **tail, **error, **common)
        return transition_replica(r.pk, State.STOPPED, actor_label=label, reason=event.error, **tail, **error)


def apply_node_report(report: NodeReport) -> dict:
    """Refresh the node and reconcile its replicas with what the agent runs; returns what
    changed (for logs and tests)."""
    done = {"lost": [], "stopped": [], "resent": []}
    if report.leaving:  # a clean agent shutdown: its replicas' stopped events follow
        inventory.node_left(report.node, "its node agent shut down", report.at_ns)
        return done
    node = inventory.node_reported(report.node, report.hostname, report.devices, report.at_ns)
    if node is None:
        return done  # older than a report already applied
    running = {r.replica_id: r for r in report.replicas}
    now = timezone.now()
    live = {r.pk: r for r in Replica.objects.filter(node=node, state__in=Replica.LIVE_STATES)}
    for rid, r in live.items():
        seen = running.get(rid)
        if seen is not None:
            fields = {"last_heartbeat": now, **_status_fields(seen.status)}
            if seen.log_tail is not None:
                fields["log_tail"] = seen.log_tail
            # Not over what a newer event wrote (a stopped event's last log lines, applied by
            # another control worker thread since `live` was read): the report is older.
            Replica.objects.filter(pk=rid, state__in=Replica.LIVE_STATES, last_event_ns__lt=report.at_ns).update(
                **fields
            )
        elif r.state == State.PENDING:
            if now - r.created_at > RESEND_START_AFTER and _resend_due(rid):
                with transaction.atomic():
                    send_start(r)
                done["resent"].append(rid)
        elif r.last_event_ns < report.at_ns:  # not a replica started after this report was made
            reason = "the node agent does not run it (the agent restarted and the process was gone)"
            if transition_replica(
                rid, State.STOPPED, actor_label=f"agent:{node.name}", reason=reason, last_error=reason
            ):
                done["lost"].append(rid)
    ended = set(running) - set(live)
    if ended:
        still_there = set(
            Replica.objects.filter(pk__in=ended, last_event_ns__gt=report.at_ns).values_list("pk", flat=True)
        )
        for rid in sorted(ended - still_there):
            with transaction.atomic():
                _stop_on_node(node.name, rid, "the database has no live replica by that id on this node")
            done["stopped"].append(rid)
    return done


def _resend_due(replica_id: int) -> bool:
    """At most one resend per replica per RESEND_START_AFTER, across control workers."""
    key = f"switchyard:replica:{replica_id}:start-resent"
    return bool(redis_client.client().set(key, "1", nx=True, ex=int(RESEND_START_AFTER.total_seconds())))
