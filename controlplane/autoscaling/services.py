"""Each interval (Celery beat → `autoscaling.tick`): measure every autoscaled deployment over the
interval, decide (policy.py), record the decision and, in active mode, scale.

What is measured comes from the replicas' heartbeats, as the console's telemetry reads them
(telemetry/history.py): per replica process, the counters' differences since the previous tick
(prompt and output tokens, finished requests, TTFT and ITL histograms), so a replica that starts
or restarts between two ticks is counted from zero, never as a fall; the mean queue over the
interval comes from the telemetry's per-second points."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict

from django.db import transaction
from django.utils import timezone

from controlplane.autoscaling.models import Autoscaling
from controlplane.autoscaling.policy import Decision, Demand, Settings, capacity, decide
from controlplane.common import redis as redis_client
from controlplane.common.errors import DomainError
from controlplane.deployments import services as deployments
from controlplane.deployments.models import Deployment, Replica
from controlplane.deployments.placement import room_for
from controlplane.events.services import record_event
from controlplane.telemetry.history import aggregate, history, quantile
from controlplane.telemetry.prometheus import replica_statuses
from workers.sim.profile import DEFAULT_PROFILE, ProfileError, load_profile, shipped_profiles

log = logging.getLogger(__name__)
PREVIOUS_KEY = "switchyard:autoscaler:previous"
# Lengths assumed before any request has finished (they size the capacity estimate).
DEFAULT_PROMPT_TOKENS, DEFAULT_OUTPUT_TOKENS = 512.0, 128.0


def settings_of(auto: Autoscaling) -> Settings:
    return Settings(
        min_replicas=auto.min_replicas,
        max_replicas=auto.max_replicas,
        ttft_p90_ms=auto.ttft_p90_ms,
        itl_p90_ms=auto.itl_p90_ms,
        cooldown_seconds=auto.scale_down_cooldown_seconds,
        tolerance=auto.tolerance,
    )


def validate(auto: Autoscaling) -> None:
    """DomainError (a 400) for settings the autoscaler cannot act on."""
    dep = auto.deployment
    if auto.enabled and dep.mode != Deployment.Mode.COLOCATED:
        raise DomainError(
            "autoscaling a disaggregated deployment's prefill and decode pools is not built yet; "
            "it scales colocated deployments",
            "enabled",
        )
    if auto.min_replicas > auto.max_replicas:
        raise DomainError(f"min_replicas {auto.min_replicas} is above max_replicas {auto.max_replicas}", "min_replicas")
    if auto.capacity_profile and auto.capacity_profile not in shipped_profiles():
        raise DomainError(f"no profile {auto.capacity_profile!r}: one of {shipped_profiles()}", "capacity_profile")


def profile_of(auto: Autoscaling):
    name = auto.capacity_profile or auto.deployment.sim_profile or DEFAULT_PROFILE
    try:
        return load_profile(name)
    except ProfileError:
        return load_profile(DEFAULT_PROFILE)


def demand_of(totals: dict | None, seconds: float, points: list[dict], last: dict | None) -> Demand | None:
    """The interval's demand from a deployment's totals (telemetry.history.aggregate); None
    before there is an interval to measure. Mean lengths fall back on the last interval's."""
    if totals is None or not totals["counted"] or seconds <= 0:
        return None
    finished = totals["requests_finished"]
    # Prompt tokens the prefix cache served cost no prefill: only the computed ones are demand.
    computed = max(totals["prompt_tokens"] - totals["cached_prompt_tokens"], 0)
    prompt = computed / finished if finished else (last or {}).get("mean_prompt_tokens")
    output = totals["generation_tokens"] / finished if finished else (last or {}).get("mean_output_tokens")
    waiting = [p["waiting"] for p in points if p.get("waiting") is not None]

    def p90_ms(name: str) -> float | None:
        hist = totals.get(name)
        value = quantile(hist["buckets"], hist["counts"], 0.9) if hist else None
        return round(value * 1000, 3) if value is not None else None

    return Demand(
        prompt_tokens_per_s=computed / seconds,
        output_tokens_per_s=totals["generation_tokens"] / seconds,
        mean_prompt_tokens=prompt or DEFAULT_PROMPT_TOKENS,
        mean_output_tokens=output or DEFAULT_OUTPUT_TOKENS,
        waiting=sum(waiting) / len(waiting) if waiting else float(totals["waiting"]),
        ttft_p90_ms=p90_ms("ttft"),
        itl_p90_ms=p90_ms("itl"),
    )


def change_in_progress(dep: Deployment) -> str:
    """Why the deployment is not settled ("" when it is): replicas starting or draining, or fewer
    or more live replicas than it is set to."""
    live = list(Replica.objects.filter(deployment=dep, state__in=Replica.LIVE_STATES).values_list("state", flat=True))
    moving = [s for s in live if s != Replica.State.READY]
    if moving:
        return f"{len(moving)} replica(s) {'/'.join(sorted(set(moving)))}"
    if len(live) != dep.replicas:
        return f"{len(live)} live replicas, {dep.replicas} wanted"
    return ""


def tick(client=None, now: float | None = None) -> dict[str, dict]:
    """One interval for every deployment with autoscaling enabled; their decisions by slug."""
    client = client or redis_client.client()
    now = now or time.time()
    raw = client.get(PREVIOUS_KEY)
    previous = json.loads(raw) if raw else {}
    totals, counters = aggregate(replica_statuses(client), previous.get("replicas"))
    client.set(PREVIOUS_KEY, json.dumps({"t": now, "replicas": counters}), ex=3600)
    seconds = now - previous["t"] if "t" in previous else 0.0
    decisions = {}
    for auto in Autoscaling.objects.filter(enabled=True).select_related("deployment"):
        slug = auto.deployment.slug
        points = [p for p in history(client, slug) if p["t"] > now - seconds]  # this interval's
        try:
            decision = step(auto, demand_of(totals.get(slug), seconds, points, auto.recommendation.get("demand")))
        except Exception:  # one deployment's trouble must not stop the others' autoscaling
            log.exception("autoscaling %s failed", slug)
            continue
        if decision is not None:
            decisions[slug] = decision.as_dict()
    return decisions


@transaction.atomic
def step(auto: Autoscaling, demand: Demand | None) -> Decision | None:
    """Decide for one deployment, record it, and in active mode apply it."""
    auto = Autoscaling.objects.select_for_update().select_related("deployment").get(pk=auto.pk)
    dep = auto.deployment
    if demand is None or dep.desired_state != Deployment.DesiredState.RUNNING:
        return None
    if dep.mode != Deployment.Mode.COLOCATED:  # changed to disaggregated after autoscaling was enabled
        return None
    last = auto.recommendation
    previous = Demand(**last["demand"]) if last.get("demand") else None
    settings = settings_of(auto)
    kv_tokens = _kv_tokens(dep)
    cap = capacity(profile_of(auto), settings, demand, dep.max_num_seqs, kv_tokens)
    since = (timezone.now() - auto.last_change_at).total_seconds() if auto.last_change_at else None
    changing = change_in_progress(dep)
    # The interval after a change settles measured (part of it) the old replica count: skip it.
    settling = not changing and bool(last.get("unsettled"))
    decision = decide(settings, dep.replicas, demand, previous, cap, changing=changing, settling=settling,
                      since_change=since, room=room_for(dep))  # fmt: skip
    changed = decision.replicas != dep.replicas
    auto.recommendation = {
        "at": timezone.now().isoformat(),
        "mode": auto.mode,
        "current": dep.replicas,
        "decision": decision.as_dict(),
        "demand": asdict(demand),
        "capacity": asdict(cap),
        "profile": profile_of(auto).source[:80],
        "unsettled": bool(changing) or (changed and auto.mode == Autoscaling.Mode.ACTIVE),
    }
    # An event per change (per new recommendation in advisory mode, not one every interval).
    recommended_before = (last.get("decision") or {}).get("replicas")
    if changed and (auto.mode == Autoscaling.Mode.ACTIVE or decision.replicas != recommended_before):
        verb = "autoscaling.scaled" if auto.mode == Autoscaling.Mode.ACTIVE else "autoscaling.recommended"
        record_event(verb, dep, actor_label="autoscaler", data={"from": dep.replicas, **auto.recommendation})
        auto.last_change_at = timezone.now()  # the cooldown, in advisory mode too: it recommends what active would do
    if changed and auto.mode == Autoscaling.Mode.ACTIVE:
        deployments.update_deployment(dep, {"replicas": decision.replicas})
    auto.save(update_fields=["recommendation", "last_change_at", "updated_at"])
    return decision


def _kv_tokens(dep: Deployment) -> int:
    """Tokens one replica's KV cache holds, from its latest load report (blocks x block size)."""
    for load in Replica.objects.filter(deployment=dep, state=Replica.State.READY).values_list("load", flat=True):
        blocks = (load or {}).get("kv_blocks_total")
        if blocks:
            policy = dep.cache_policy
            return int(blocks) * (policy.block_size if policy else 16)
    return 1 << 30
