"""Per-deployment metric history at 1 s resolution, for the console's charts.

Every second (Celery beat → `telemetry.sample`) each replica's counters and histograms are
compared with what the same replica process reported at the previous sample; the differences,
summed per deployment, give tokens/s, TTFT and ITL percentiles of that second (interpolated
within histogram buckets, as Prometheus' histogram_quantile does), the prefix-cache hit rate and,
where replicas speculate, that second's mean acceptance length; gauges give queue depth and KV
use, `speculation` what the deployment's live replicas drafted and accepted since they started
(by position in a draft run), and `cache_tiers` where the prompt blocks they looked up came from
since they started: the device cache, or a KV tier (DRAM, store, disk). Each point is appended
to a Redis list capped at 15 minutes and sent to the `metrics` Channels group.

Differences are taken per replica process (replica id + incarnation), never on a deployment's
sum: when a replica leaves, the sum falls, and a fall of the sum cannot be told from a restart,
which used to count every token of the remaining replicas as generated in that one second. A
process that the previous sample did not see started since, so everything it counted is new.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict

from controlplane.telemetry.prometheus import mean_acceptance_length, replica_statuses

HISTORY_SECONDS = 900
GROUP = "metrics"
PREVIOUS_KEY = "switchyard:telemetry:previous"
COUNTERS = ("generation_tokens", "prefix_cache_hits", "prefix_cache_queries", "spec_drafts", "spec_accepted",
            "prompt_tokens", "cached_prompt_tokens", "requests_finished")  # fmt: skip
HISTOGRAMS = {"ttft": "ttft_seconds", "itl": "itl_seconds"}


def history_key(deployment: str) -> str:
    return f"switchyard:telemetry:history:{deployment}"


def _new_totals() -> dict:
    """A deployment's gauges (its fresh replicas, now) and counts (all its replicas, since the
    previous sample; `counted` is false when there was none)."""
    return {"running": 0, "waiting": 0, "kv_blocks_total": 0, "kv_blocks_free": 0, "replicas_up": 0,
            "counted": False, "speculation": None, "cache_tiers": None, **dict.fromkeys(COUNTERS, 0),
            **dict.fromkeys(HISTOGRAMS)}  # fmt: skip


def _add_hist(acc: dict | None, h: dict) -> dict:
    if acc is None:
        return {"buckets": list(h["buckets"]), "counts": list(h["counts"])}
    if acc["buckets"] == list(h["buckets"]):
        acc["counts"] = [a + b for a, b in zip(acc["counts"], h["counts"], strict=True)]
    return acc


def replica_counters(metrics: dict, load: dict) -> dict:
    """What one replica process has counted since it started (its counters only grow)."""
    spec = metrics.get("speculative") if isinstance(metrics.get("speculative"), dict) else {}
    counters = {
        "generation_tokens": metrics.get("generation_tokens", 0),
        "prefix_cache_hits": load.get("prefix_cache_hits", 0),
        "prefix_cache_queries": load.get("prefix_cache_queries", 0),
        "spec_drafts": spec.get("num_drafts", 0),
        "spec_accepted": sum(spec.get("accepted_per_position") or []),
        "prompt_tokens": metrics.get("prompt_tokens", 0),
        "cached_prompt_tokens": metrics.get("cached_prompt_tokens", 0),
        "requests_finished": metrics.get("requests_finished", 0),
    }
    for name, key in HISTOGRAMS.items():
        if key in metrics:
            counters[name] = {"buckets": list(metrics[key]["buckets"]), "counts": list(metrics[key]["counts"])}
    return counters


def _delta(cur: int, prev: int) -> int:
    return cur - prev if cur >= prev else cur  # never negative, even if a counter went back


def _add_positions(acc: list[int], counts: list[int]) -> list[int]:
    longer, shorter = (acc, counts) if len(acc) >= len(counts) else (counts, acc)
    return [n + (shorter[i] if i < len(shorter) else 0) for i, n in enumerate(longer)]


def _add_speculation(acc: dict | None, spec: dict) -> dict:
    """A deployment's speculation since its live replica processes started, summed."""
    acc = acc or {
        "num_drafts": 0,
        "drafted_per_position": [],
        "accepted_per_position": [],
        "verify_seconds": 0.0,
        "draft_seconds": 0.0,
    }
    acc["num_drafts"] += spec.get("num_drafts", 0)
    for key in ("drafted_per_position", "accepted_per_position"):
        acc[key] = _add_positions(acc[key], spec.get(key) or [])
    for key in ("verify_seconds", "draft_seconds"):
        acc[key] = round(acc[key] + spec.get(key, 0.0), 6)
    return acc


def _add_cache_tiers(acc: dict | None, load: dict) -> dict:
    """A deployment's prompt blocks looked up since its live replica processes started, and how
    many of them each cache served: the device prefix cache, or a KV tier the replica has."""
    acc = acc or {"queries": 0, "blocks": {"device": 0}}
    acc["queries"] += load.get("prefix_cache_queries", 0)
    acc["blocks"]["device"] += load.get("prefix_cache_hits", 0)
    tiers = load.get("kv_tiers") if isinstance(load.get("kv_tiers"), dict) else {}
    for tier, blocks in (tiers.get("blocks_loaded") or {}).items():
        acc["blocks"][tier] = acc["blocks"].get(tier, 0) + blocks
    return acc


def counted_since(cur: dict, prev: dict | None) -> dict:
    """What one replica process counted since the previous sample: the difference, or everything
    for a process the previous sample did not see."""
    if prev is None:
        return cur
    out = {k: _delta(cur[k], prev.get(k, 0)) for k in COUNTERS}
    for name in HISTOGRAMS:
        c, p = cur.get(name), prev.get(name)
        if c is None:
            continue
        out[name] = c
        if p is not None and p["buckets"] == c["buckets"]:
            diff = [a - b for a, b in zip(c["counts"], p["counts"], strict=True)]
            if min(diff) >= 0:
                out[name] = {"buckets": c["buckets"], "counts": diff}
    return out


def aggregate(statuses, previous: dict[str, dict] | None) -> tuple[dict[str, dict], dict[str, dict]]:
    """Per deployment: the gauges of its live replicas and what its replicas counted since
    `previous` (each replica process's counters at the previous sample, None if there was none).
    Also returns each replica process's counters now, the `previous` of the next sample."""
    totals: dict[str, dict] = defaultdict(_new_totals)
    counters: dict[str, dict] = {}
    for replica, status in statuses:
        t = totals[replica.deployment.slug]
        if status is None:
            continue
        metrics, load = status.metrics, status.load
        process = f"{replica.pk}:{status.incarnation}"
        counters[process] = replica_counters(metrics, load)
        if previous is not None:
            t["counted"] = True
            new = counted_since(counters[process], previous.get(process))
            for key in COUNTERS:
                t[key] += new[key]
            for name in HISTOGRAMS:
                if new.get(name) is not None:
                    t[name] = _add_hist(t[name], new[name])
        if isinstance(metrics.get("speculative"), dict):
            t["speculation"] = _add_speculation(t["speculation"], metrics["speculative"])
        t["cache_tiers"] = _add_cache_tiers(t["cache_tiers"], load)
        if status.is_fresh():
            t["replicas_up"] += 1
            for key in ("running", "waiting", "kv_blocks_total", "kv_blocks_free"):
                t[key] += load.get(key, 0)
    return dict(totals), counters


def quantile(buckets: list[float], counts: list[int], q: float) -> float | None:
    """The q-quantile of a histogram (per-bucket counts, +Inf last), linear within a bucket."""
    total = sum(counts)
    if total <= 0:
        return None
    rank, seen, lower = q * total, 0, 0.0
    for upper, n in zip([*buckets, buckets[-1]], counts, strict=True):
        if n and seen + n >= rank:
            return lower + (upper - lower) * (rank - seen) / n
        seen += n
        lower = upper
    return buckets[-1]


def point(now: float, t: dict, dt: float | None) -> dict:
    """A history point from a deployment's totals (see aggregate), `dt` seconds after the last."""
    out = {
        "t": round(now, 3),
        "replicas_up": t["replicas_up"],
        "running": t["running"],
        "waiting": t["waiting"],
        "queue_depth": t["running"] + t["waiting"],
        "kv_use": round(1 - t["kv_blocks_free"] / t["kv_blocks_total"], 4) if t["kv_blocks_total"] else None,
        "tokens_per_second": None,
        "cache_hit_rate": None,
        "spec_acceptance_length": None,
        "speculation": _speculation(t["speculation"]),
        "cache_tiers": _cache_tiers(t["cache_tiers"]),
    }
    for name in HISTOGRAMS:
        out[f"{name}_p50_ms"] = out[f"{name}_p90_ms"] = None
    if not t["counted"] or not dt or dt <= 0:
        return out
    out["tokens_per_second"] = round(t["generation_tokens"] / dt, 2)
    if t["prefix_cache_queries"] > 0:
        out["cache_hit_rate"] = round(t["prefix_cache_hits"] / t["prefix_cache_queries"], 4)
    if t["spec_drafts"] > 0:
        out["spec_acceptance_length"] = round(1 + t["spec_accepted"] / t["spec_drafts"], 4)
    for name in HISTOGRAMS:
        if t[name] is None:
            continue
        for q in (50, 90):
            v = quantile(t[name]["buckets"], t[name]["counts"], q / 100)
            out[f"{name}_p{q}_ms"] = round(v * 1000, 3) if v is not None else None
    return out


def _speculation(spec: dict | None) -> dict | None:
    """The point's `speculation`: None where no live replica speculates; else the sums, the mean
    acceptance length and, by position, the share of draft runs whose guess there was accepted
    (vLLM's per-position acceptance rate: the shares add up to the mean acceptance length - 1)."""
    if spec is None:
        return None
    drafts, accepted = spec["num_drafts"], spec["accepted_per_position"]
    return {
        **spec,
        "mean_acceptance_length": mean_acceptance_length(drafts, accepted),
        "acceptance_per_position": [round(n / drafts, 4) if drafts else None for n in accepted],
    }


def _cache_tiers(tiers: dict | None) -> dict | None:
    """The point's `cache_tiers`: None before any replica reported; else the sums and, by cache,
    its share of the blocks looked up (null before any was)."""
    if tiers is None:
        return None
    queries = tiers["queries"]
    rates = {name: round(n / queries, 4) if queries else None for name, n in tiers["blocks"].items()}
    return {**tiers, "hit_rate": rates}


def sample(redis_client, now: float | None = None) -> dict[str, dict]:
    """Take one sample of every deployment; returns the new points by deployment."""
    now = now or time.time()
    raw = redis_client.get(PREVIOUS_KEY)
    previous = json.loads(raw) if raw else {}
    totals, counters = aggregate(replica_statuses(redis_client), previous.get("replicas"))
    dt = now - previous["t"] if "t" in previous else None
    points = {}
    pipe = redis_client.pipeline(transaction=False)
    for slug, t in totals.items():
        points[slug] = p = point(now, t, dt)
        pipe.rpush(history_key(slug), json.dumps(p))
        pipe.ltrim(history_key(slug), -HISTORY_SECONDS, -1)
        pipe.expire(history_key(slug), HISTORY_SECONDS * 2)
    pipe.set(PREVIOUS_KEY, json.dumps({"t": now, "replicas": counters}), ex=HISTORY_SECONDS)
    pipe.execute()
    return points


def history(redis_client, deployment: str, seconds: int = HISTORY_SECONDS) -> list[dict]:
    return [json.loads(x) for x in redis_client.lrange(history_key(deployment), -max(seconds, 1), -1)]
