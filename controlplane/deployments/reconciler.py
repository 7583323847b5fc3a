"""The reconciler: compares each deployment's desired replicas with the live ones and acts. It
places new replicas (placement.py) and asks their node agents to start them, rolls restarts
(replacements first, up to `max_surge`, then drains the outgoing), scales down the least
loaded, keeps the failure budget (a generation whose replicas keep failing is given up until an
operator starts or restarts it) and shows on the deployment why replicas are not placed.

Run by the `deployments.reconcile` task (tasks.py): after any change and from beat.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.deployments.messaging import publish_deployment, publish_replica, send_start
from controlplane.deployments.models import Deployment, Replica
from controlplane.deployments.placement import place, placement_problem
from controlplane.deployments.replica_states import State, stop_replica
from controlplane.events.services import record_event

log = logging.getLogger(__name__)


def reconcile_deployment(dep: Deployment) -> dict:
    """One deployment's pass; returns what it did (for logs and tests).

    Per role, replicas of an older generation and those an operator asked to drain are
    *outgoing*: they keep serving while their replacements start (at most `max_surge` beyond
    the desired count) and drain as replacements turn ready. Outgoing replicas that serve
    nothing yet are stopped at once. Scaling down drains the least loaded replicas."""
    done = {"started": [], "stopped": [], "unplaced": 0}
    with transaction.atomic():
        dep = Deployment.objects.select_for_update().get(pk=dep.pk)
        live = list(dep.replica_set.select_related("node", "deployment").filter(state__in=Replica.ACTIVE_STATES))
        desired = dep.desired_counts()
        for r in live:
            if r.role not in desired:
                stop_replica(r, reason="not desired")
                done["stopped"].append(r.pk)
        _reset_failure_budget(dep, live)
        for role, want in desired.items():
            _reconcile_role(dep, role, want, [r for r in live if r.role == role], done)
        _note_placement(dep, done["unplaced"])
    return done


def _outgoing(dep: Deployment, r: Replica) -> str:
    """Why `r` is to be replaced, or "" if it stays."""
    if r.generation != dep.generation:
        return "restart"
    return "drain requested" if r.drain_requested_at else ""


def _drain_order(r: Replica) -> tuple:
    """Which replica to let go first: one serving nothing yet, then the least loaded (requests
    running + waiting, from its heartbeat), then the newest (its prefix cache is the coldest)."""
    load = r.load if isinstance(r.load, dict) else {}
    try:
        queued = int(load.get("running", 0)) + int(load.get("waiting", 0))
    except (TypeError, ValueError):
        queued = 0
    return (r.state == State.READY, queued, -r.pk)


def _reconcile_role(dep: Deployment, role: str, want: int, replicas: list[Replica], done: dict) -> None:
    def let_go(r: Replica, reason: str) -> None:
        stop_replica(r, reason=reason)
        done["stopped"].append(r.pk)

    current = [r for r in replicas if not _outgoing(dep, r)]
    outgoing = []
    for r in replicas:
        if _outgoing(dep, r):
            # Not serving yet, or (given up) nothing will replace it: no reason to wait.
            if r.state != State.READY or (dep.failed_at is not None and r.drain_requested_at):
                let_go(r, _outgoing(dep, r))
            else:
                outgoing.append(r)
    if len(current) > want:
        extra = sorted(current, key=_drain_order)[: len(current) - want]
        for r in extra:
            let_go(r, "scaled down")
        current = [r for r in current if r not in extra]

    # Drain outgoing replicas while enough others are ready: with a surge, all `want`; without
    # one, one replica may be missing at a time (replace in place).
    ready = sum(r.state == State.READY for r in current) + len(outgoing)
    excess = ready - max(want - (0 if dep.max_surge else 1), 0)
    for r in sorted(outgoing, key=_drain_order)[: max(excess, 0)]:
        let_go(r, _outgoing(dep, r))
        outgoing.remove(r)

    missing = want - len(current)
    if missing <= 0 or not _budget_left(dep):
        return
    room = want + dep.max_surge - len(current) - len(outgoing)
    unplaced = 0
    for _ in range(max(min(missing, room), 0)):
        placement = place(dep)
        if placement is None:
            unplaced += 1
            continue
        node, devices = placement
        r = Replica.objects.create(deployment=dep, role=role, node=node, generation=dep.generation)
        r.devices.set(devices)
        record_event("replica.pending", r, actor_label="reconciler", data={"node": node.name})
        publish_replica(r)
        send_start(r)
        done["started"].append(r.pk)
    done["unplaced"] += unplaced
    if unplaced and outgoing and not dep.replica_set.filter(role=role, state=State.DRAINING).exists():
        # No room for an extra replica, and none being freed: replace one in place, so that
        # the rollout goes on (a one-replica deployment then has a gap).
        r = min(outgoing, key=_drain_order)
        let_go(r, f"{_outgoing(dep, r)}; no room to start its replacement first")


def _reset_failure_budget(dep: Deployment, live: list[Replica]) -> None:
    """Forgive the generation's failures once one of its replicas has been ready for
    REPLICA_HEALTHY_SECONDS: failures before that moment no longer count."""
    healthy = timedelta(seconds=settings.SWITCHYARD["REPLICA_HEALTHY_SECONDS"])
    now = timezone.now()
    marks = [
        r.ready_at + healthy
        for r in live
        if r.generation == dep.generation and r.state == State.READY and r.ready_at and r.ready_at + healthy <= now
    ]
    mark = max(marks, default=None)
    if mark is not None and (dep.failure_budget_reset_at is None or mark > dep.failure_budget_reset_at):
        dep.failure_budget_reset_at = mark
        dep.save(update_fields=["failure_budget_reset_at"])


def _budget_left(dep: Deployment) -> bool:
    """Whether the reconciler may start replicas; if not, the deployment has given up (a
    `deployment.failed` event, once) until an operator starts or restarts it."""
    if dep.failed_at is not None:
        return False
    failed = dep.replica_set.filter(generation=dep.generation, state=State.FAILED)
    if dep.failure_budget_reset_at is not None:
        failed = failed.filter(stopped_at__gt=dep.failure_budget_reset_at)
    count = failed.count()
    budget = settings.SWITCHYARD["REPLICA_FAILURE_BUDGET"]
    if count < budget:
        return True
    dep.failed_at = timezone.now()
    dep.failed_reason = f"{count} replicas of generation {dep.generation} failed (the failure budget is {budget})"
    dep.save(update_fields=["failed_at", "failed_reason"])
    log.warning("%s: %s", dep.slug, dep.failed_reason)
    data = {"generation": dep.generation, "failed_replicas": count, "reason": dep.failed_reason}
    record_event("deployment.failed", dep, actor_label="reconciler", data=data)
    publish_deployment(dep, status=dep.status)
    return False


def _note_placement(dep: Deployment, unplaced: int) -> None:
    """Show on the deployment why replicas are missing; an event when that starts and when it
    ends, not on every reconcile pass."""
    problem = ""
    if unplaced:
        problem = f"{unplaced} replica{'s' if unplaced > 1 else ''} not placed: {placement_problem(dep)}"
    if problem == dep.placement_error:
        return
    if problem and not dep.placement_error:
        record_event("deployment.unplaced", dep, actor_label="reconciler", data={"reason": problem})
    elif not problem:
        record_event("deployment.placed", dep, actor_label="reconciler", data={"was": dep.placement_error})
    dep.placement_error = problem
    dep.save(update_fields=["placement_error"])
    publish_deployment(dep, placement_error=problem)


def reconcile_all() -> dict[str, dict]:
    return {dep.slug: reconcile_deployment(dep) for dep in Deployment.objects.all()}
