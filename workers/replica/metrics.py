"""Serving metrics a replica keeps and reports with each heartbeat (torch-free).

Counters only grow (Prometheus semantics: the web process renders them at /metrics, and a
restart of the replica starts them again at zero, which Prometheus' rate() handles).
Histograms are cumulative with fixed buckets, so any number of replicas can be summed.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from workers.protocol.replica import KVTierCounters, KVTiersLoad, SpeculativeMetrics

# Seconds. TTFT spans queueing and prefill; ITL one decode step plus delivery.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# A request's phases and whole life: from milliseconds (a queue that was empty) to minutes.
REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, plus +Inf last; not cumulative
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def as_dict(self) -> dict:
        return {
            "buckets": list(self.buckets),
            "counts": list(self.counts),
            "sum": round(self.total, 6),
            "count": self.count,
        }


@dataclass
class ReplicaMetrics:
    requests_finished: int = 0
    requests_aborted: int = 0
    requests_errored: int = 0  # ended by the engine failing on them (error events "engine_error")
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generation_tokens: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    # Each finished request: waiting to be scheduled, its prompt (to the first token), its
    # output (to the last), and the three together (vLLM's queue / prefill / decode / e2e).
    queue: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS))
    prefill: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS))
    decode: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS))

    def token(self, arrived: float, last: float | None, now: float, n: int = 1) -> None:
        """`n` tokens of one request came out at `now` (previous one at `last`)."""
        self.generation_tokens += n
        if last is None:
            self.ttft.observe(now - arrived)
        else:
            self.itl.observe(now - last)

    def finished(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.requests_finished += 1
        self.prompt_tokens += prompt_tokens
        self.cached_prompt_tokens += cached_tokens

    def phases(self, queue: float, prefill: float, decode: float) -> None:
        """A finished request's time in each phase (seconds, each >= 0)."""
        self.queue.observe(queue)
        self.prefill.observe(prefill)
        self.decode.observe(decode)
        self.e2e.observe(queue + prefill + decode)

    def as_dict(self) -> dict:
        return {
            "requests_finished": self.requests_finished,
            "requests_aborted": self.requests_aborted,
            "requests_errored": self.requests_errored,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "generation_tokens": self.generation_tokens,
            "ttft_seconds": self.ttft.as_dict(),
            "itl_seconds": self.itl.as_dict(),
            "queue_seconds": self.queue.as_dict(),
            "prefill_seconds": self.prefill.as_dict(),
            "decode_seconds": self.decode.as_dict(),
            "e2e_seconds": self.e2e.as_dict(),
        }


def speculative_metrics(method: str, stats: dict | None) -> SpeculativeMetrics | None:
    """What the replica reports of its engine's speculation (`LLMEngine.speculation_stats()`, counters
    since start), or None when the engine does not speculate."""
    if stats is None:
        return None
    out: SpeculativeMetrics = {
        "method": method,
        "num_drafts": int(stats.get("num_drafts", 0)),
        "num_verify_steps": int(stats.get("num_verify_steps", 0)),
        "drafted_per_position": [int(n) for n in stats.get("drafted_per_position", [])],
        "accepted_per_position": [int(n) for n in stats.get("accepted_per_position", [])],
        "verify_seconds": round(float(stats.get("verify_seconds", 0.0)), 6),
        "draft_seconds": round(float(stats.get("draft_seconds", 0.0)), 6),
    }
    if "chosen_k" in stats:  # choose_k "measured" (auto)
        out["chosen_k"] = [int(n) for n in stats["chosen_k"]]
        out["gain_seconds"] = {key: round(float(v), 6) for key, v in stats["gain_seconds"].items()}
    return out


TIER_COUNTS = ("hits", "misses", "bytes_read", "bytes_written", "checksum_failures", "errors", "evictions",
               "used_bytes", "capacity_bytes")  # fmt: skip
TIER_SECONDS = ("read_seconds", "write_seconds")


def tier_metrics(stats: dict | None) -> KVTiersLoad | None:
    """What the replica reports of its engine's KV tiers (`LLMEngine.tier_stats()`), or None when
    it has none. Typed and rounded here: the engine's dict is not the wire's."""
    if stats is None:
        return None
    tiers: dict[str, KVTierCounters] = {}
    for name, counts in (stats.get("tiers") or {}).items():
        tier = {key: int(counts.get(key, 0)) for key in TIER_COUNTS}
        tier.update({key: round(float(counts.get(key, 0.0)), 6) for key in TIER_SECONDS})
        tier["available"] = bool(counts.get("available", True))
        tiers[str(name)] = tier  # type: ignore[assignment]
    return {
        "tiers": tiers,
        # the tiers it has only (the engine counts every kind)
        "blocks_loaded": {str(k): int(v) for k, v in (stats.get("blocks_loaded") or {}).items() if k in tiers},
        "load_seconds": round(float(stats.get("load_seconds", 0.0)), 6),
        "dropped_writes": int(stats.get("dropped_writes", 0)),
        "loads_inflight": int(stats.get("loads_inflight", 0)),
    }
