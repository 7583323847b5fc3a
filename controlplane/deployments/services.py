"""Deployment actions: create and update (validated), start, stop, restart, drain, and cache
policies. Each change is audited, published, and followed by a reconcile pass after commit; the
reconciler (reconciler.py) then moves the replicas, through the state machine
(replica_states.py), with node agents told through messaging.py.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.catalog import services as catalog
from controlplane.common.errors import DomainError
from controlplane.deployments import compatibility, simulation
from controlplane.deployments.messaging import publish_deployment, schedule_reconcile
from controlplane.deployments.models import CachePolicy, Deployment, Replica
from controlplane.deployments.replica_states import State, stop_replica
from controlplane.events.services import record_event
from controlplane.inventory.models import Device
from controlplane.inventory.selectors import placeable_nodes
from controlplane.planner.services import check_deployment_fits


def _changed(dep: Deployment, verb: str, actor=None, data: dict | None = None) -> Deployment:
    """After any change to a deployment: audit it, tell live clients, reconcile after commit."""
    record_event(f"deployment.{verb}", dep, actor=actor, data=data)
    publish_deployment(dep)
    schedule_reconcile()
    return dep


# -- validation ---------------------------------------------------------------------------------
# Settings the engine does not run together are refused by the table in compatibility.py.
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+")  # RFC 9110 token
RESERVED_HEADERS = frozenset({"authorization", "content-type", "content-length", "host", "cookie"})


# Changing one of these checks the draft against the model's files again.
SPECULATION_FIELDS = ("model", "speculative_method", "draft_model")


def validate_speculation(data: dict, check_files: bool = True) -> None:
    """ngram drafts from the prompt and output (no draft model); eagle3 needs a registered
    EAGLE-3 head that fits the deployment's model; auto takes one or none; none takes none."""
    method = data.get("speculative_method", Deployment.Speculative.NONE)
    draft = data.get("draft_model")
    if method not in (Deployment.Speculative.EAGLE3, Deployment.Speculative.AUTO):
        if draft is not None:
            raise DomainError(
                f"draft_model is only used by speculative_method 'eagle3' or 'auto' (this deployment's is "
                f"{method!r}); leave it empty (null)",
                "draft_model",
            )
        return
    if draft is None and method == Deployment.Speculative.AUTO:
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
    simulation.check(data)  # what the simulated engine does not simulate
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
    sizes = [node.devices.filter(health=Device.Health.HEALTHY).count() for node in placeable_nodes()]
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
        elif (stopped := stop_replica(r, reason="drain requested")) is not None:
            drained.append(stopped)
    _changed(dep, "drain", actor, {"replicas": [r.pk for r in drained]})
    return drained


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
