"""Deployment lifecycle: create/validate, actions, the reconciler, and replica transitions.

The reconciler compares each deployment's desired replicas with the live ones, places new
replicas on nodes with free devices and asks node agents (a Celery task on `node.<name>`)
to start or stop processes (`send_start` / `send_stop`). Agents report back with messages that
`node_sync` applies through `transition_replica`, the one writer of replica state.
"""

from __future__ import annotations

import logging
import re
from datetime import timedelta
from pathlib import PurePosixPath

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from controlplane.catalog import services as catalog
from controlplane.common.errors import DomainError
from controlplane.deployments import compatibility
from controlplane.deployments.models import CachePolicy, Deployment, Replica
from controlplane.deployments.specs import build_spec
from controlplane.events.broadcast import publish
from controlplane.events.services import record_event
from controlplane.inventory.models import Device, Node
from controlplane.inventory.selectors import placeable_nodes
from controlplane.planner.services import check_deployment_fits
from workers.protocol import control

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


def send_start(replica: Replica) -> None:
    """Ask the replica's node agent to start it, from a spec built now (after commit)."""
    spec = build_spec(replica).to_wire()
    _send_after_commit(control.START_REPLICA, spec, replica.node.queue)


def send_stop(replica: Replica) -> None:
    _send_after_commit(control.STOP_REPLICA, replica.pk, replica.node.queue)


def _send_after_commit(task: str, arg, queue: str) -> None:
    from controlplane.config.celery_app import app

    transaction.on_commit(lambda: app.send_task(task, args=[arg], queue=queue))


def schedule_reconcile() -> None:
    from controlplane.deployments.tasks import reconcile

    transaction.on_commit(lambda: reconcile.delay())


def _changed(dep: Deployment, verb: str, actor=None, data: dict | None = None) -> Deployment:
    """After any change to a deployment: audit it, tell live clients, reconcile after commit."""
    record_event(f"deployment.{verb}", dep, actor=actor, data=data)
    _publish_deployment(dep)
    schedule_reconcile()
    return dep


def _publish_deployment(dep: Deployment, **extra) -> None:
    publish("deployment", {"slug": dep.slug, "desired_state": dep.desired_state, "generation": dep.generation, **extra})


def _publish_replica(r: Replica) -> None:
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


# -- validation ---------------------------------------------------------------------------------
# Settings the engine does not run together are refused by the table in compatibility.py.
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+")  # RFC 9110 token
RESERVED_HEADERS = frozenset({"authorization", "content-type", "content-length", "host", "cookie"})


# Changing one of these checks the draft against the model's files again.
SPECULATION_FIELDS = ("model", "speculative_method", "draft_model")


def validate_speculation(data: dict, check_files: bool = True) -> None:
    """ngram drafts from the prompt and output (no draft model); eagle3 needs a registered
    EAGLE-3 head that fits the deployment's model; none takes no draft model either."""
    method = data.get("speculative_method", Deployment.Speculative.NONE)
    draft = data.get("draft_model")
    if method != Deployment.Speculative.EAGLE3:
        if draft is not None:
            raise DomainError(
                f"draft_model is only used by speculative_method 'eagle3' (this deployment's is {method!r}); "
                "leave it empty (null)",
                "draft_model",
            )
        return
    if draft is None:
        raise DomainError(
            "speculative_method 'eagle3' needs a draft_model: a registered EAGLE-3 head trained for the model",
            "draft_model",
        )
    model = data.get("model")
    if check_files and model is not None:
        catalog.check_draft(draft, model)


def validate_deployment(data: dict, changed: set[str] | None = None) -> None:
    """`data` is the whole deployment; `changed` the fields being set (None: all, a new one)."""
    mode = data.get("mode", Deployment.Mode.COLOCATED)
    if mode == Deployment.Mode.DISAGGREGATED:
        if data.get("prefill_replicas", 0) < 1:
            raise DomainError("a disaggregated deployment needs at least one prefill replica", "prefill_replicas")
        if data.get("decode_replicas", 0) < 1:
            raise DomainError("a disaggregated deployment needs at least one decode replica", "decode_replicas")
    validate_parallel(data)
    model = data.get("model")
    max_len = data.get("max_model_len")
    if model is not None and max_len and model.context_length and max_len > model.context_length:
        raise DomainError(
            f"max_model_len {max_len} exceeds the model's context length {model.context_length}", "max_model_len"
        )
    if model is not None and model.status == model.Status.ERROR:
        raise DomainError(f"model {model.name!r} failed validation: {model.status_message}", "model")
    if model is not None and model.is_draft:
        raise DomainError(
            f"model {model.name!r} is an EAGLE-3 draft head ({model.architecture}): it drafts tokens for a target "
            "model and is not served on its own; deploy the target and set this as its draft_model "
            "with speculative_method 'eagle3'",
            "model",
        )
    validate_speculation(data, check_files=changed is None or bool(changed & set(SPECULATION_FIELDS)))
    compatibility.check_deployment(data, changed)  # combinations the engine refuses
    check_deployment_fits(data, changed)  # its weights fit the CUDA devices it would be placed on


def validate_parallel(data: dict) -> None:
    """A replica over tensor_parallel x pipeline_parallel devices of one node (the engine's
    parallel/ package): refuse a size no node can hold (what the model cannot be split into is
    the engine's to refuse, naming why, when the replica starts)."""
    tp, pp = data.get("tensor_parallel") or 1, data.get("pipeline_parallel") or 1
    need = tp * pp
    if need == 1:
        return
    sizes = [
        node.devices.filter(health=Device.Health.HEALTHY).count()
        for node in placeable_nodes()
    ]  # fmt: skip
    if sizes and max(sizes) < need:
        raise DomainError(
            f"tensor_parallel {tp} x pipeline_parallel {pp} needs {need} devices on one node; the largest "
            f"online node has {max(sizes)} healthy device{'s' * (max(sizes) != 1)}",
            "tensor_parallel",
        )


@transaction.atomic
def create_deployment(data: dict, actor=None) -> Deployment:
    if Deployment.objects.filter(slug=data.get("slug")).exists():
        raise DomainError(f"a deployment named {data['slug']!r} already exists", "slug")
    validate_deployment(data)
    dep = Deployment.objects.create(**data)
    return _changed(dep, "created", actor, {"mode": dep.mode})


@transaction.atomic
def update_deployment(dep: Deployment, data: dict, actor=None) -> Deployment:
    """Engine settings (dtype, limits, cache policy, speculation) reach replicas started from now
    on: `restart` rolls the running ones onto them."""
    merged = {f.name: getattr(dep, f.name) for f in Deployment._meta.concrete_fields}
    merged.update(data)
    validate_deployment(merged, changed=set(data))
    for key, value in data.items():
        setattr(dep, key, value)
    dep.save()
    return _changed(dep, "updated", actor, {k: str(v) for k, v in data.items()})


# -- actions ------------------------------------------------------------------------------------
def _locked(dep: Deployment) -> Deployment:
    return Deployment.objects.select_for_update().get(pk=dep.pk)


def _clear_failure(dep: Deployment) -> dict:
    """An operator's start or restart: the deployment tries again with a fresh failure budget."""
    if dep.failed_at is None:
        return {}
    cleared = {"cleared_failure": dep.failed_reason}
    dep.failed_at, dep.failed_reason, dep.failure_budget_reset_at = None, "", timezone.now()
    dep.save(update_fields=["failed_at", "failed_reason", "failure_budget_reset_at", "updated_at"])
    return cleared


@transaction.atomic
def start(dep: Deployment, actor=None) -> Deployment:
    dep = _locked(dep)
    if dep.desired_state != Deployment.DesiredState.RUNNING:
        dep.desired_state = Deployment.DesiredState.RUNNING
        dep.generation += 1  # a fresh start forgets earlier failures
        dep.save(update_fields=["desired_state", "generation", "updated_at"])
    return _changed(dep, "start", actor, _clear_failure(dep) or None)


@transaction.atomic
def stop(dep: Deployment, actor=None) -> Deployment:
    dep = _locked(dep)
    dep.desired_state = Deployment.DesiredState.STOPPED
    dep.save(update_fields=["desired_state", "updated_at"])
    return _changed(dep, "stop", actor)


@transaction.atomic
def restart(dep: Deployment, actor=None) -> Deployment:
    """Replace every replica with a new one (a new generation). The reconciler rolls: new
    replicas start (up to `max_surge` beyond the desired count) and old ones drain as new ones
    turn ready, so the deployment keeps answering."""
    dep = _locked(dep)
    dep.generation += 1
    dep.save(update_fields=["generation", "updated_at"])
    return _changed(dep, "restart", actor, {"generation": dep.generation, **_clear_failure(dep)})


@transaction.atomic
def drain(dep: Deployment, replica_id: int | None = None, actor=None) -> list[Replica]:
    """Drain one replica or, without an id, every replica and stop the deployment. Draining
    replicas finish in-flight requests and accept none. One ready replica is drained by the
    reconciler once its replacement is ready (at once with `max_surge` 0, or once the deployment
    has given up); one that serves nothing yet is drained now."""
    live = dep.replica_set.filter(state__in=Replica.ACTIVE_STATES)
    if replica_id is not None:
        live = live.filter(pk=replica_id)
    targets = list(live.select_related("node", "deployment"))
    if replica_id is not None and not targets:
        raise DomainError(f"deployment {dep.slug!r} has no live replica {replica_id}", "replica")
    if replica_id is None:
        dep.desired_state = Deployment.DesiredState.STOPPED
        dep.save(update_fields=["desired_state", "updated_at"])
    drained = []
    for r in targets:
        if replica_id is not None and r.state == State.READY:
            r.drain_requested_at = timezone.now()
            r.save(update_fields=["drain_requested_at"])
            drained.append(r)
        elif (stopped := _stop_replica(r, reason="drain requested")) is not None:
            drained.append(stopped)
    _changed(dep, "drain", actor, {"replicas": [r.pk for r in drained]})
    return drained


# -- replicas -------------------------------------------------------------------------------------
def transition_replica(
    replica_id: int, state: str, *, actor_label: str = "agent", reason: str = "", **fields
) -> Replica | None:
    """Move a replica to `state` if the state machine allows it; returns it, or None if refused.
    Every replica state change goes through here (audit event, live update, timestamps, and a
    reconcile after commit when the move gives the reconciler work: RECONCILE_ON)."""
    with transaction.atomic():
        r = (
            Replica.objects.select_for_update(of=("self",))
            .select_related("deployment", "node")
            .filter(pk=replica_id)
            .first()
        )
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
            _publish_replica(r)
            if state in RECONCILE_ON:
                schedule_reconcile()
    return r


def _stop_replica(r: Replica, reason: str) -> Replica | None:
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


def _free_devices(node: Node, kind: str | None = None) -> list[Device]:
    """Devices of `node` with room for one more replica (CPU devices host several)."""
    per_cpu = settings.SWITCHYARD["CPU_REPLICAS_PER_DEVICE"]
    devices = node.devices.filter(health=Device.Health.HEALTHY).annotate(
        used=Count("replicas", filter=Q(replicas__state__in=Replica.LIVE_STATES))
    )
    free = [d for d in devices if d.used < (per_cpu if d.kind == Device.Kind.CPU else 1)]
    return [d for d in free if kind is None or d.kind == kind]


def _place(dep: Deployment) -> tuple[Node, list[Device]] | None:
    need = dep.devices_per_replica
    nodes = (
        placeable_nodes()
        .annotate(load=Count("replicas", filter=Q(replicas__state__in=Replica.LIVE_STATES)))
        .order_by("load", "name")
    )
    for node in nodes:
        for kind in (Device.Kind.CUDA, Device.Kind.CPU):
            free = _free_devices(node, kind)
            if kind == Device.Kind.CPU and len(free) >= need:
                # CPU replicas share the node's CPU devices; a parallel one takes one per rank.
                return node, free[:need]
            if len(free) >= need:
                return node, free[:need]
    return None


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
                _stop_replica(r, reason="not desired")
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
        _stop_replica(r, reason=reason)
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
        placement = _place(dep)
        if placement is None:
            unplaced += 1
            continue
        node, devices = placement
        r = Replica.objects.create(deployment=dep, role=role, node=node, generation=dep.generation)
        r.devices.set(devices)
        record_event("replica.pending", r, actor_label="reconciler", data={"node": node.name})
        _publish_replica(r)
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
    _publish_deployment(dep, status=dep.status)
    return False


def _placement_problem(dep: Deployment) -> str:
    """Why `_place` found no room, in words for the console."""
    nodes = list(placeable_nodes().order_by("name"))
    if not nodes:
        return "no online node"
    need = dep.devices_per_replica
    rooms = []
    for node in nodes:
        healthy = node.devices.filter(health=Device.Health.HEALTHY).count()
        rooms.append(f"{node.name}: {len(_free_devices(node))} of {healthy} healthy devices free" if healthy
                     else f"{node.name}: no healthy device")  # fmt: skip
    return f"no online node has room for a replica ({need} device{'s' if need > 1 else ''}): " + "; ".join(rooms)


def _note_placement(dep: Deployment, unplaced: int) -> None:
    """Show on the deployment why replicas are missing; an event when that starts and when it
    ends, not on every reconcile pass."""
    problem = ""
    if unplaced:
        problem = f"{unplaced} replica{'s' if unplaced > 1 else ''} not placed: {_placement_problem(dep)}"
    if problem == dep.placement_error:
        return
    if problem and not dep.placement_error:
        record_event("deployment.unplaced", dep, actor_label="reconciler", data={"reason": problem})
    elif not problem:
        record_event("deployment.placed", dep, actor_label="reconciler", data={"was": dep.placement_error})
    dep.placement_error = problem
    dep.save(update_fields=["placement_error"])
    _publish_deployment(dep, placement_error=problem)


def reconcile_all() -> dict[str, dict]:
    return {dep.slug: reconcile_deployment(dep) for dep in Deployment.objects.all()}


# -- cache policies -----------------------------------------------------------------------------
def save_cache_policy(policy: CachePolicy, actor=None, created: bool = False) -> CachePolicy:
    validate_kv_tiers(policy)
    compatibility.check_cache_policy(policy)  # tiers turned on under a parallel deployment
    header = policy.session_affinity_header.strip().lower()  # header names ignore case
    if not HEADER_NAME.fullmatch(header) or header in RESERVED_HEADERS:
        raise DomainError(
            "session_affinity_header must be an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)"
            f" other than {', '.join(sorted(RESERVED_HEADERS))}",
            "session_affinity_header",
        )
    policy.session_affinity_header = header
    policy.save()
    record_event("cache_policy.created" if created else "cache_policy.updated", policy, actor=actor)
    return policy


def validate_kv_tiers(policy: CachePolicy) -> None:
    """The KV tiers a policy asks for must be ones a replica can run (docs/caching.md): a disk
    tier has an absolute directory and a budget, the store is configured on this control plane,
    and the tiers have a prefix cache to extend."""
    path, disk_bytes = policy.disk_tier_path, policy.disk_tier_bytes
    if disk_bytes and not path:
        message = "a disk tier needs a directory: set disk_tier_path (absolute, on every node), or disk_tier_bytes to 0"
        raise DomainError(message, "disk_tier_path")
    if path and not disk_bytes:
        message = "a disk tier needs a byte budget: set disk_tier_bytes, or leave disk_tier_path empty"
        raise DomainError(message, "disk_tier_bytes")
    if path and not _plain_absolute(path):
        message = (
            f"disk_tier_path must be an absolute directory without '..', e.g. /var/cache/switchyard/kv; got {path!r}"
        )
        raise DomainError(message[:300], "disk_tier_path")
    if policy.store_tier and not settings.SWITCHYARD["KV_STORE_MASTER"]:
        raise DomainError(
            "this control plane has no Mooncake Store: run a mooncake_master (python -m workers.kvtiers.master "
            "--port 50051; make run starts one) and set SWITCHYARD_KV_STORE_MASTER=host:port for the web and "
            "control processes (docs/operations.md, 'The KV store'); or leave store_tier false",
            "store_tier",
        )
    tiers = [name for name in ("dram_tier_bytes", "disk_tier_bytes", "store_tier") if getattr(policy, name)]
    if tiers and not policy.prefix_caching:
        message = f"KV tiers extend the prefix cache: turn prefix_caching on, or the tiers off ({', '.join(tiers)})"
        raise DomainError(message, "prefix_caching")
    if policy.min_cached_prefix_tokens and not (disk_bytes or policy.store_tier):
        raise DomainError(
            "min_cached_prefix_tokens is the shortest prefix worth loading from the store or disk, and this policy "
            "has neither: turn store_tier or a disk tier on, or leave it at 0",
            "min_cached_prefix_tokens",
        )


def _plain_absolute(path: str) -> bool:
    pure = PurePosixPath(path)
    return pure.is_absolute() and ".." not in pure.parts and "\x00" not in path and path == path.strip()
