"""Per-deployment metric history at 1 s resolution, for the console's charts.

Every second (Celery beat → `telemetry.sample`) the replicas' counters and histograms are summed
per deployment and compared with the previous sample: the difference gives tokens/s, TTFT and
ITL percentiles of that second (interpolated within histogram buckets, as Prometheus'
histogram_quantile does), the prefix-cache hit rate; gauges give queue depth and KV use. Each
point is appended to a Redis list capped at 15 minutes and sent to the `metrics` Channels group.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict

from controlplane.telemetry.prometheus import replica_statuses
from workers.replica import protocol

HISTORY_SECONDS = 900
GROUP = "metrics"
PREVIOUS_KEY = "switchyard:telemetry:previous"


def history_key(deployment: str) -> str:
    return f"switchyard:telemetry:history:{deployment}"


def _new_totals() -> dict:
    return {"generation_tokens": 0, "prefix_cache_hits": 0, "prefix_cache_queries": 0, "running": 0, "waiting": 0,
            "kv_blocks_total": 0, "kv_blocks_free": 0, "replicas_up": 0, "ttft": None, "itl": None}  # fmt: skip


def _add_hist(acc: dict | None, h: dict) -> dict:
    if acc is None:
        return {"buckets": list(h["buckets"]), "counts": list(h["counts"])}
    if acc["buckets"] == list(h["buckets"]):
        acc["counts"] = [a + b for a, b in zip(acc["counts"], h["counts"], strict=True)]
    return acc


def aggregate(statuses) -> dict[str, dict]:
    """Sum what each deployment's live replicas report."""
    totals: dict[str, dict] = defaultdict(_new_totals)
    for replica, status in statuses:
        t = totals[replica.deployment.slug]
        if not status or not protocol.is_fresh(status):
            continue
        try:
            metrics = json.loads(status.get("metrics") or "{}")
            load = json.loads(status.get("load") or "{}")
        except ValueError:
            continue
        t["replicas_up"] += 1
        t["generation_tokens"] += metrics.get("generation_tokens", 0)
        for key in ("prefix_cache_hits", "prefix_cache_queries", "running", "waiting", "kv_blocks_total",
                    "kv_blocks_free"):  # fmt: skip
            t[key] += load.get(key, 0)
        if "ttft_seconds" in metrics:
            t["ttft"] = _add_hist(t["ttft"], metrics["ttft_seconds"])
        if "itl_seconds" in metrics:
            t["itl"] = _add_hist(t["itl"], metrics["itl_seconds"])
    return dict(totals)


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


def _delta(cur: int, prev: int) -> int:
    return cur - prev if cur >= prev else cur  # a replica restarted: its counters began again


def point(now: float, cur: dict, prev: dict | None, prev_time: float | None) -> dict:
    dt = (now - prev_time) if prev_time else None
    out = {
        "t": round(now, 3),
        "replicas_up": cur["replicas_up"],
        "running": cur["running"],
        "waiting": cur["waiting"],
        "queue_depth": cur["running"] + cur["waiting"],
        "kv_use": round(1 - cur["kv_blocks_free"] / cur["kv_blocks_total"], 4) if cur["kv_blocks_total"] else None,
        "tokens_per_second": None,
        "cache_hit_rate": None,
    }
    for name in ("ttft", "itl"):
        out[f"{name}_p50_ms"] = out[f"{name}_p90_ms"] = None
    if prev is None or not dt or dt <= 0:
        return out
    out["tokens_per_second"] = round(_delta(cur["generation_tokens"], prev["generation_tokens"]) / dt, 2)
    queries = _delta(cur["prefix_cache_queries"], prev["prefix_cache_queries"])
    if queries > 0:
        out["cache_hit_rate"] = round(_delta(cur["prefix_cache_hits"], prev["prefix_cache_hits"]) / queries, 4)
    for name in ("ttft", "itl"):
        c, p = cur.get(name), prev.get(name)
        if c is None:
            continue
        counts = c["counts"]
        if p is not None and p["buckets"] == c["buckets"]:
            diff = [a - b for a, b in zip(c["counts"], p["counts"], strict=True)]
            counts = diff if min(diff) >= 0 else c["counts"]
        for q in (50, 90):
            v = quantile(c["buckets"], counts, q / 100)
            out[f"{name}_p{q}_ms"] = round(v * 1000, 3) if v is not None else None
    return out


def sample(redis_client, now: float | None = None) -> dict[str, dict]:
    """Take one sample of every deployment; returns the new points by deployment."""
    now = now or time.time()
    current = aggregate(replica_statuses(redis_client))
    raw = redis_client.get(PREVIOUS_KEY)
    previous = json.loads(raw) if raw else {}
    points = {}
    pipe = redis_client.pipeline(transaction=False)
    for slug, totals in current.items():
        prev = previous.get("totals", {}).get(slug)
        points[slug] = p = point(now, totals, prev, previous.get("t"))
        pipe.rpush(history_key(slug), json.dumps(p))
        pipe.ltrim(history_key(slug), -HISTORY_SECONDS, -1)
        pipe.expire(history_key(slug), HISTORY_SECONDS * 2)
    pipe.set(PREVIOUS_KEY, json.dumps({"t": now, "totals": current}), ex=HISTORY_SECONDS)
    pipe.execute()
    return points


def history(redis_client, deployment: str, seconds: int = HISTORY_SECONDS) -> list[dict]:
    return [json.loads(x) for x in redis_client.lrange(history_key(deployment), -max(seconds, 1), -1)]
