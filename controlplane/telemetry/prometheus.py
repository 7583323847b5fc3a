"""Prometheus text exposition of what the replicas report (their Redis status hashes).

Each replica keeps its own counters and histograms (workers/replica/metrics.py) and sends them
with every heartbeat; this module only renders them, labelled by deployment, replica and role,
so a Prometheus server can sum and rate them however it likes. The gateway's own counters (mid-
stream failovers and routing quality, per deployment) are kept in Redis by the web processes.
Torch-free.
"""

from __future__ import annotations

import logging

from controlplane.deployments import crashes
from controlplane.deployments.models import Deployment, Replica
from controlplane.gateway import failover
from controlplane.gateway.routing import quality
from controlplane.telemetry.vllm_names import add_vllm_series
from workers.protocol import replica as protocol
from workers.protocol.replica import ReplicaStatus
from workers.protocol.wire import ProtocolError

log = logging.getLogger(__name__)


def _labels(**labels) -> str:
    def esc(v) -> str:
        return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


def _num(v) -> str:
    return repr(float(v)) if isinstance(v, float) else str(int(v))


class Exposition:
    def __init__(self):
        self.families: dict[str, tuple[str, str, list[str]]] = {}

    def add(self, name: str, kind: str, help_text: str, labels: dict, value, suffix: str = "", extra=None) -> None:
        lines = self.families.setdefault(name, (kind, help_text, []))[2]
        lines.append(f"{name}{suffix}{_labels(**labels, **(extra or {}))} {_num(value)}")

    def histogram(self, name: str, help_text: str, labels: dict, data: dict) -> None:
        cumulative = 0
        for bound, count in zip([*data["buckets"], "+Inf"], data["counts"], strict=True):
            cumulative += count
            le = bound if bound == "+Inf" else repr(float(bound))
            self.add(name, "histogram", help_text, labels, cumulative, "_bucket", {"le": le})
        self.add(name, "histogram", help_text, labels, float(data["sum"]), "_sum")
        self.add(name, "histogram", help_text, labels, data["count"], "_count")

    def render(self) -> str:
        out = []
        for name, (kind, help_text, lines) in self.families.items():
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *lines]
        return "\n".join(out) + "\n"


COUNTERS = {
    "requests_finished": ("switchyard_requests_total", "Requests that finished (stop or length)."),
    "requests_aborted": ("switchyard_requests_aborted_total", "Requests aborted because the client went away."),
    "requests_errored": (
        "switchyard_engine_request_errors_total",
        "Requests the engine failed on, ended alone with an engine_error (the others carried on).",
    ),
    "prompt_tokens": ("switchyard_prompt_tokens_total", "Prompt tokens of finished requests."),
    "cached_prompt_tokens": ("switchyard_cached_prompt_tokens_total", "Prompt tokens served from the prefix cache."),
    "generation_tokens": ("switchyard_generation_tokens_total", "Output tokens generated."),
}
GAUGES = {
    "running": ("switchyard_running_requests", "Requests in the running batch."),
    "waiting": ("switchyard_waiting_requests", "Requests queued for admission."),
    "kv_blocks_total": ("switchyard_kv_blocks", "KV cache blocks of the replica."),
    "kv_blocks_free": ("switchyard_kv_blocks_free", "Free KV cache blocks."),
    "tokens_per_second": ("switchyard_tokens_per_second", "Output tokens per second over the last second."),
}
CACHE_COUNTERS = {
    "prefix_cache_queries": ("switchyard_prefix_cache_queries_total", "Prompt blocks looked up in the prefix cache."),
    "prefix_cache_hits": ("switchyard_prefix_cache_hits_total", "Prompt blocks found in the prefix cache."),
}
KV_COUNTERS = {
    "bytes_sent": ("switchyard_kv_transfer_bytes_sent_total", "KV bytes sent to decode replicas."),
    "bytes_received": ("switchyard_kv_transfer_bytes_received_total", "KV bytes received from prefill replicas."),
    "blocks_sent": ("switchyard_kv_transfer_blocks_sent_total", "KV blocks sent."),
    "blocks_received": ("switchyard_kv_transfer_blocks_received_total", "KV blocks received."),
    "transfer_seconds": ("switchyard_kv_transfer_seconds_total", "Time spent writing KV blocks."),
    "fallbacks": ("switchyard_kv_transfer_fallbacks_total", "Requests a decode replica prefilled itself."),
}


# A replica with KV tiers reports them per tier (workers.protocol.replica.KVTiersLoad), labelled `tier`.
TIER_SERIES = {
    "hits": ("switchyard_kv_tier_hits_total", "counter", "KV blocks found in the tier."),
    "misses": ("switchyard_kv_tier_misses_total", "counter",
               "KV blocks looked up in the tier and not found (checksum failures included)."),
    "bytes_read": ("switchyard_kv_tier_read_bytes_total", "counter", "Bytes read from the tier."),
    "bytes_written": ("switchyard_kv_tier_written_bytes_total", "counter", "Bytes written to the tier."),
    "read_seconds": ("switchyard_kv_tier_read_seconds_total", "counter", "Time spent reading from the tier."),
    "write_seconds": ("switchyard_kv_tier_write_seconds_total", "counter", "Time spent writing to the tier."),
    "checksum_failures": ("switchyard_kv_tier_checksum_failures_total", "counter",
                          "KV blocks read from the tier whose checksum did not match (never used)."),
    "errors": ("switchyard_kv_tier_errors_total", "counter", "Tier calls that failed."),
    "evictions": ("switchyard_kv_tier_evictions_total", "counter", "KV blocks evicted to stay within the budget."),
    "used_bytes": ("switchyard_kv_tier_used_bytes", "gauge",
                   "Bytes the tier holds (the store: the whole shared store, as this replica sees it)."),
    "capacity_bytes": ("switchyard_kv_tier_capacity_bytes", "gauge",
                       "The tier's byte budget (the store: its capacity)."),
    "available": ("switchyard_kv_tier_available", "gauge", "1 while the tier can be reached."),
}  # fmt: skip
TIER_BLOCKS_LOADED = (
    "switchyard_kv_tier_blocks_loaded_total",
    "Prompt blocks admissions took from the tier instead of computing them.",
)
TIERS_SERIES = {
    "load_seconds": ("switchyard_kv_tier_load_seconds_total", "counter", "Time the store and disk loads took."),
    "dropped_writes": (
        "switchyard_kv_tier_dropped_writes_total",
        "counter",
        "KV blocks not written to a tier because its writes fell behind.",
    ),
    "loads_inflight": ("switchyard_kv_tier_loads_inflight", "gauge", "Requests waiting on a tier load."),
}


TENANT_COUNTERS = (
    ("switchyard_tenant_prompt_tokens_total", "Prompt tokens the replica served per tenant (API key owner)."),
    ("switchyard_tenant_generation_tokens_total", "Output tokens the replica generated per tenant."),
)


def _tenants(exp: Exposition, labels: dict, tenants: dict) -> None:
    """What fair sharing counts (workers/engine/fair_share.py), unweighted, labelled `tenant`."""
    for tenant, served in sorted(tenants.items()):
        if isinstance(served, list) and len(served) == 2:
            for (name, help_text), value in zip(TENANT_COUNTERS, served, strict=True):
                exp.add(name, "counter", help_text, {**labels, "tenant": tenant}, value)


def _kv_tiers(exp: Exposition, labels: dict, tiers: dict) -> None:
    for tier, counts in sorted((tiers.get("tiers") or {}).items()):
        for key, (name, kind, help_text) in TIER_SERIES.items():
            if key in counts:
                exp.add(name, kind, help_text, labels, counts[key], extra={"tier": tier})
    for tier, blocks in sorted((tiers.get("blocks_loaded") or {}).items()):
        exp.add(TIER_BLOCKS_LOADED[0], "counter", TIER_BLOCKS_LOADED[1], labels, blocks, extra={"tier": tier})
    for key, (name, kind, help_text) in TIERS_SERIES.items():
        if key in tiers:
            exp.add(name, kind, help_text, labels, tiers[key])


# A replica that speculates reports its engine's counters (workers.protocol.replica.SpeculativeMetrics).
SPEC_COUNTERS = {
    "num_drafts": ("switchyard_spec_drafts_total", "Draft runs verified (one per sequence per verifying step)."),
    "num_verify_steps": ("switchyard_spec_verify_steps_total", "Engine steps that verified drafts."),
    "verify_seconds": ("switchyard_spec_verify_seconds_total", "Time in engine steps that verified drafts."),
    "draft_seconds": ("switchyard_spec_draft_seconds_total", "Time spent proposing drafts."),
}
SPEC_PER_POSITION = {
    "drafted_per_position": (
        "switchyard_spec_draft_tokens_total",
        "Draft tokens proposed, by position in the draft run (0: the first guess).",
    ),
    "accepted_per_position": (
        "switchyard_spec_accepted_tokens_total",
        "Draft tokens accepted, by position in the draft run (0: the first guess).",
    ),
}
SPEC_CHOSEN_K = (
    "switchyard_spec_chosen_k_total",
    "Decoding sequences given k draft tokens by the measured choice (speculative method auto), by k (0: none).",
)
SPEC_GAIN = (
    "switchyard_spec_gain_seconds_total",
    "Over the steps the measured choice drafted in (speculative method auto): the seconds their tokens would have "
    'taken in plain decode steps (side="plain") and the seconds they took (side="spent"), as the cost model '
    'expected (basis="expected") and as measured (basis="measured"). plain / spent is the speed-up.',
)
SPEC_SPEEDUP = {
    "expected": (
        "switchyard_spec_expected_speedup",
        "Speed-up the measured choice expected of the steps it drafted in, since the replica started.",
    ),
    "measured": (
        "switchyard_spec_measured_speedup",
        "Speed-up measured over the steps the measured choice drafted in, since the replica started.",
    ),
}
SPEC_ACCEPTANCE_LENGTH = (
    "switchyard_spec_mean_acceptance_length",
    "Tokens a draft run yields on average (its accepted guesses plus the target's own token), since the replica "
    "started.",
)


def mean_acceptance_length(num_drafts: int, accepted_per_position: list[int]) -> float | None:
    return round(1 + sum(accepted_per_position) / num_drafts, 4) if num_drafts else None


def _speculation(exp: Exposition, labels: dict, spec: dict) -> None:
    for key, (name, help_text) in SPEC_COUNTERS.items():
        if key in spec:
            exp.add(name, "counter", help_text, labels, spec[key])
    for key, (name, help_text) in SPEC_PER_POSITION.items():
        for position, count in enumerate(spec.get(key) or []):
            exp.add(name, "counter", help_text, labels, count, extra={"position": position})
    for k, count in enumerate(spec.get("chosen_k") or []):
        exp.add(SPEC_CHOSEN_K[0], "counter", SPEC_CHOSEN_K[1], labels, count, extra={"k": k})
    gain = spec.get("gain_seconds") or {}
    for basis in ("expected", "measured"):
        plain, spent = gain.get(f"{basis}_plain"), gain.get(basis)
        if plain is None or spent is None:
            continue
        for side, value in (("plain", plain), ("spent", spent)):
            exp.add(SPEC_GAIN[0], "counter", SPEC_GAIN[1], labels, value, extra={"basis": basis, "side": side})
        if spent:
            exp.add(SPEC_SPEEDUP[basis][0], "gauge", SPEC_SPEEDUP[basis][1], labels, round(plain / spent, 4))
    length = mean_acceptance_length(spec.get("num_drafts", 0), spec.get("accepted_per_position") or [])
    if length is not None:
        exp.add(SPEC_ACCEPTANCE_LENGTH[0], "gauge", SPEC_ACCEPTANCE_LENGTH[1], labels, length)


FAILOVER_COUNTERS = {
    "resumed": ("switchyard_requests_resumed_total", "Requests resumed on another replica after theirs was lost."),
    "failed": (
        "switchyard_requests_failover_failed_total",
        "Requests whose replica was lost with no other replica to resume them on.",
    ),
    "poison": (
        "switchyard_poison_requests_total",
        "Requests failed, not resumed, after a second replica was lost under them (suspected of killing them).",
    ),
}
CRASHES = (
    "switchyard_replica_crashes_total",
    "Replica processes that exited unexpectedly; attributed: with a request in flight that a replica had died "
    "under before (not counted toward the replica's restart limit).",
)


# gateway/routing/quality.py's sums. Achieved hit rate = cached / served input tokens; reachable =
# reachable cached / input tokens (of the decisions): a ratio of rates, left to the querier.
ROUTING_COUNTERS = {
    "decisions": ("switchyard_routing_decisions_total", "Routing decisions made knowing the prompt's token ids."),
    "best_prefix_decisions": ("switchyard_routing_best_prefix_decisions_total",
                              "Routing decisions that chose a replica holding the longest cached prefix of any."),
    "routed_input_tokens": ("switchyard_routing_input_tokens_total", "Prompt tokens of the routing decisions."),
    "reachable_tokens": ("switchyard_routing_reachable_cached_tokens_total",
                         "Prompt tokens cached on the best replica the load bound allowed (perfect routing)."),
    "predicted_tokens": ("switchyard_routing_predicted_cached_tokens_total",
                         "Prompt tokens cached on the replica chosen (the gateway's prediction)."),
    "input_tokens": ("switchyard_routing_served_input_tokens_total", "Prompt tokens of requests that finished."),
    "cached_tokens": ("switchyard_routing_cached_tokens_total",
                      "Prompt tokens of requests that finished that their replica served from its prefix cache."),
}  # fmt: skip


def routing_quality(redis_client) -> dict[str, dict[str, int]]:
    """Every deployment's routing-quality sums (see gateway/routing/quality.py), read in one pipeline."""
    slugs = list(Deployment.objects.order_by("slug").values_list("slug", flat=True))
    pipe = redis_client.pipeline(transaction=False)
    for slug in slugs:
        pipe.hgetall(quality.quality_key(slug))
    return {
        slug: {name: int(raw.get(name, 0)) for name in quality.FIELDS}
        for slug, raw in zip(slugs, pipe.execute(), strict=True)
    }


def replica_statuses(redis_client) -> list[tuple[Replica, ReplicaStatus | None]]:
    """Each live replica and what it reports (None: nothing, or nothing this side can read)."""
    replicas = list(Replica.objects.filter(state__in=Replica.LIVE_STATES).select_related("deployment").order_by("id"))
    pipe = redis_client.pipeline(transaction=False)
    for r in replicas:
        pipe.hgetall(protocol.status_key(r.pk))
    return [(r, _status(r, raw)) for r, raw in zip(replicas, pipe.execute(), strict=True)]


def _status(replica: Replica, raw: dict) -> ReplicaStatus | None:
    if not raw:
        return None
    try:
        return ReplicaStatus.from_hash(raw)
    except ProtocolError as exc:
        log.warning("replica %s: unreadable status hash (%s)", replica.pk, exc)
        return None


def render(redis_client) -> str:
    exp = Exposition()
    for replica, status in replica_statuses(redis_client):
        labels = {"deployment": replica.deployment.slug, "replica": replica.pk, "role": replica.role}
        exp.add(
            "switchyard_replica_up",
            "gauge",
            "1 while the replica heartbeats.",
            labels,
            int(status is not None and status.is_fresh()),
        )
        if status is None:
            continue
        metrics, load = status.metrics, status.load
        for key, (name, help_text) in COUNTERS.items():
            if key in metrics:
                exp.add(name, "counter", help_text, labels, metrics[key])
        for key, name in (
            ("ttft_seconds", "switchyard_time_to_first_token_seconds"),
            ("itl_seconds", "switchyard_inter_token_latency_seconds"),
        ):
            if key in metrics:
                exp.histogram(
                    name, f"{name.removeprefix('switchyard_').replace('_', ' ')} per request", labels, metrics[key]
                )
        for table, source, kind in (
            (GAUGES, load, "gauge"),
            (CACHE_COUNTERS, load, "counter"),
            (KV_COUNTERS, load.get("kv_transfer") or {}, "counter"),
        ):
            for key, (name, help_text) in table.items():
                if key in source:
                    exp.add(name, kind, help_text, labels, source[key])
        for entry in load.get("rank_memory") or []:  # per rank: weights, KV cache, the rest
            for kind in ("weights", "kv_cache", "other"):
                if isinstance(entry, dict) and kind in entry:
                    exp.add(
                        "switchyard_replica_rank_memory_bytes",
                        "gauge",
                        "bytes a replica's rank holds after load, by kind (weights, kv_cache, other)",
                        {**labels, "rank": entry.get("rank", 0), "kind": kind},
                        entry[kind],
                    )
        if isinstance(load.get("kv_tiers"), dict):  # only replicas with KV tiers report them
            _kv_tiers(exp, labels, load["kv_tiers"])
        if isinstance(metrics.get("speculative"), dict):  # only replicas that speculate report it
            _speculation(exp, labels, metrics["speculative"])
        if isinstance(metrics.get("tenants"), dict):
            _tenants(exp, labels, metrics["tenants"])
        add_vllm_series(exp, replica.deployment.slug, replica.pk, status)
    for slug, outcomes in sorted(failover.counts(redis_client).items()):
        for key, (name, help_text) in FAILOVER_COUNTERS.items():
            exp.add(name, "counter", help_text, {"deployment": slug}, outcomes[key])
    for slug, outcomes in sorted(crashes.counts(redis_client).items()):
        for outcome, count in sorted(outcomes.items()):
            exp.add(CRASHES[0], "counter", CRASHES[1], {"deployment": slug},
                    count, extra={"attributed": str(outcome == "attributed").lower()})  # fmt: skip
    for slug, sums in routing_quality(redis_client).items():
        for key, (name, help_text) in ROUTING_COUNTERS.items():
            exp.add(name, "counter", help_text, {"deployment": slug}, sums[key])
    return exp.render()
