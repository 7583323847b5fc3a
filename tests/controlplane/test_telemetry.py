"""Metric history arithmetic: percentiles from histogram deltas, rates, counter resets."""

import pytest

from controlplane.telemetry.history import point, quantile

BUCKETS = [0.01, 0.1, 1.0]


def totals(tokens=0, hits=0, queries=0, itl=(0, 0, 0, 0), ttft=(0, 0, 0, 0), running=0, waiting=0, free=10):
    return {"generation_tokens": tokens, "prefix_cache_hits": hits, "prefix_cache_queries": queries,
            "running": running, "waiting": waiting, "kv_blocks_total": 10, "kv_blocks_free": free,
            "replicas_up": 1, "itl": {"buckets": BUCKETS, "counts": list(itl)},
            "ttft": {"buckets": BUCKETS, "counts": list(ttft)}}  # fmt: skip


def test_quantile_interpolates_within_buckets_and_clamps_the_overflow():
    assert quantile(BUCKETS, [0, 0, 0, 0], 0.5) is None
    assert quantile(BUCKETS, [10, 0, 0, 0], 0.5) == pytest.approx(0.005)  # half-way into [0, 0.01]
    assert quantile(BUCKETS, [0, 4, 0, 0], 0.5) == pytest.approx(0.055)  # half-way into [0.01, 0.1]
    assert quantile(BUCKETS, [0, 0, 0, 3], 0.9) == pytest.approx(1.0)  # +Inf: reported at the last bound


def test_a_point_reports_this_seconds_rates_and_percentiles():
    prev = totals(tokens=100, hits=2, queries=4, itl=(10, 0, 0, 0))
    cur = totals(tokens=150, hits=5, queries=8, itl=(10, 10, 0, 0), ttft=(0, 1, 0, 0), running=3, waiting=2, free=4)
    p = point(1002.0, cur, prev, 1000.0)
    assert p["tokens_per_second"] == 25.0
    assert p["cache_hit_rate"] == 0.75
    assert p["itl_p50_ms"] == pytest.approx(55.0)  # only this second's 10 gaps, all in (10 ms, 100 ms]
    assert p["ttft_p50_ms"] == pytest.approx(55.0)
    assert (p["queue_depth"], p["kv_use"]) == (5, 0.6)


def test_first_point_and_counter_resets():
    first = point(5.0, totals(tokens=10), None, None)
    assert first["tokens_per_second"] is None and first["itl_p50_ms"] is None and first["kv_use"] == 0.0
    restarted = point(2.0, totals(tokens=7, itl=(1, 0, 0, 0)), totals(tokens=500, itl=(50, 0, 0, 0)), 1.0)
    assert restarted["tokens_per_second"] == 7.0  # counted from the replica's restart, not negative
    assert restarted["itl_p50_ms"] == pytest.approx(5.0)
