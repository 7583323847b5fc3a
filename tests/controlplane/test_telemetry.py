"""Metric history arithmetic, from synthetic replica status hashes in Redis (written as a replica
writes them) through `sample`: per-second rates and percentiles, replicas that restart, leave or
join."""

import json
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.catalog.models import Model
from controlplane.common import redis as redis_client
from controlplane.deployments.models import Deployment, Replica
from controlplane.telemetry.history import PREVIOUS_KEY, history, history_key, quantile, sample
from controlplane.telemetry.prometheus import render
from workers.protocol import replica as protocol
from workers.replica.metrics import tier_metrics

BUCKETS = [0.01, 0.1, 1.0]


def test_quantile_interpolates_within_buckets_and_clamps_the_overflow():
    assert quantile(BUCKETS, [0, 0, 0, 0], 0.5) is None
    assert quantile(BUCKETS, [10, 0, 0, 0], 0.5) == pytest.approx(0.005)  # half-way into [0, 0.01]
    assert quantile(BUCKETS, [0, 4, 0, 0], 0.5) == pytest.approx(0.055)  # half-way into [0.01, 0.1]
    assert quantile(BUCKETS, [0, 0, 0, 3], 0.9) == pytest.approx(1.0)  # +Inf: reported at the last bound


@pytest.fixture
def redis():
    """This run's Redis, without the points an earlier test's stack left (its `demo` sampled by
    the beat: the run shares one Redis)."""
    client = redis_client.client()
    client.delete(PREVIOUS_KEY, history_key("demo"))
    return client


@pytest.fixture
def deployment(db):
    model = Model.objects.create(name="tiny", source="/models/tiny")
    return Deployment.objects.create(slug="demo", model=model)


def replica(deployment, state=Replica.State.READY) -> Replica:
    return Replica.objects.create(deployment=deployment, state=state)


def report(redis, r: Replica, incarnation: str, tokens=0, hits=0, queries=0, itl=(0, 0, 0, 0), ttft=(0, 0, 0, 0),
           running=0, waiting=0, free=10, spec=None, tiers=None, rank_memory=None):  # fmt: skip
    """A replica's heartbeat: the fields and encoding of workers/replica/server.py (`spec`: the
    SpeculativeMetrics of a replica that speculates; `tiers`: its engine's tier_stats())."""
    hist = lambda counts: {"buckets": BUCKETS, "counts": list(counts), "sum": 0.0, "count": sum(counts)}  # noqa: E731
    load = {"running": running, "waiting": waiting, "kv_blocks_total": 10, "kv_blocks_free": free,
            "prefix_cache_hits": hits, "prefix_cache_queries": queries}  # fmt: skip
    if tiers is not None:
        load["kv_tiers"] = tier_metrics(tiers)
    if rank_memory is not None:
        load["rank_memory"] = rank_memory
    metrics = {
        "deployment": r.deployment.slug,
        "generation_tokens": tokens,
        "ttft_seconds": hist(ttft),
        "itl_seconds": hist(itl),
        **({"speculative": spec} if spec else {}),
    }
    redis.hset(protocol.status_key(r.pk), mapping={
        "state": "ready", "load": protocol.encode(load), "metrics": protocol.encode(metrics),
        "heartbeat": f"{time.time():.3f}", "incarnation": incarnation,
    })  # fmt: skip


def test_a_point_reports_this_seconds_rates_and_percentiles(redis, deployment):
    r = replica(deployment)
    report(redis, r, "a", tokens=100, hits=2, queries=4, itl=(10, 0, 0, 0))
    first = sample(redis, now=1000.0)["demo"]
    assert first["tokens_per_second"] is None and first["itl_p50_ms"] is None and first["kv_use"] == 0.0
    report(redis, r, "a", tokens=150, hits=5, queries=8, itl=(10, 10, 0, 0), ttft=(0, 1, 0, 0), running=3,
           waiting=2, free=4)  # fmt: skip
    p = sample(redis, now=1002.0)["demo"]
    assert p["tokens_per_second"] == 25.0
    assert p["cache_hit_rate"] == 0.75
    assert p["itl_p50_ms"] == pytest.approx(55.0)  # only this second's 10 gaps, all in (10 ms, 100 ms]
    assert p["ttft_p50_ms"] == pytest.approx(55.0)
    assert (p["queue_depth"], p["kv_use"], p["replicas_up"]) == (5, 0.6, 1)
    assert [x["t"] for x in history(redis, "demo")] == [1000.0, 1002.0]


def test_a_replica_leaving_is_not_taken_for_a_counter_reset(redis, deployment):
    """Two replicas at 1000 tokens each; one leaves while the other makes 10 tokens in a second.
    The deployment's sum falls from 2020 to 1020, which must not read as 1020 tokens/s."""
    stays, leaves = replica(deployment), replica(deployment)
    for r in (stays, leaves):
        report(redis, r, f"p{r.pk}", tokens=1000, itl=(0, 500, 0, 0))
    sample(redis, now=1000.0)
    for r in (stays, leaves):
        report(redis, r, f"p{r.pk}", tokens=1010, itl=(10, 500, 0, 0))
    assert sample(redis, now=1001.0)["demo"]["tokens_per_second"] == 20.0
    Replica.objects.filter(pk=leaves.pk).update(state=Replica.State.STOPPED)
    report(redis, stays, f"p{stays.pk}", tokens=1020, itl=(20, 500, 0, 0))
    p = sample(redis, now=1002.0)["demo"]
    assert p["tokens_per_second"] == 10.0
    assert p["itl_p90_ms"] == pytest.approx(9.0)  # this second's 10 gaps under 10 ms, not the 500 older ones
    assert p["replicas_up"] == 1


def test_a_restarted_or_new_replica_counts_from_its_start(redis, deployment):
    old, new = replica(deployment), replica(deployment, state=Replica.State.STARTING)
    report(redis, old, "first", tokens=500, itl=(50, 0, 0, 0))
    sample(redis, now=1.0)
    report(redis, old, "second", tokens=7, itl=(1, 0, 0, 0))  # the same replica, a new process
    report(redis, new, "n", tokens=5)  # a replica that came up since the last sample
    p = sample(redis, now=2.0)["demo"]
    assert p["tokens_per_second"] == 12.0  # 7 + 5, counted from each process's start, never negative
    assert p["itl_p50_ms"] == pytest.approx(5.0)


def test_a_replica_whose_heartbeat_lapsed_adds_no_tokens_when_it_returns(redis, deployment):
    r = replica(deployment)
    report(redis, r, "a", tokens=300)
    sample(redis, now=1.0)
    redis.hset(protocol.status_key(r.pk), "heartbeat", "0")  # stale: not up, counters unchanged
    lapsed = sample(redis, now=2.0)["demo"]
    assert (lapsed["replicas_up"], lapsed["tokens_per_second"]) == (0, 0.0)
    report(redis, r, "a", tokens=304)
    assert sample(redis, now=3.0)["demo"]["tokens_per_second"] == 4.0


def test_a_previous_sample_in_the_old_format_starts_afresh(redis, deployment):
    report(redis, replica(deployment), "a", tokens=50)
    redis.set(PREVIOUS_KEY, json.dumps({"t": 1.0, "totals": {"demo": {"generation_tokens": 9000}}}))
    assert sample(redis, now=2.0)["demo"]["tokens_per_second"] is None


def speculative(drafts: int, drafted: list[int], accepted: list[int], verify=0.0, draft=0.0) -> dict:
    return {"method": "ngram", "num_drafts": drafts, "num_verify_steps": drafts, "drafted_per_position": drafted,
            "accepted_per_position": accepted, "verify_seconds": verify, "draft_seconds": draft}  # fmt: skip


def test_speculation_is_rendered_for_replicas_that_speculate_only(redis, deployment):
    drafting, plain = replica(deployment), replica(deployment)
    report(redis, drafting, "a", spec=speculative(10, [10, 8, 5], [7, 4, 1], verify=1.25, draft=0.0625))
    report(redis, plain, "b")
    samples = [
        s
        for f in text_string_to_metric_families(render(redis))
        for s in f.samples
        if s.name.startswith("switchyard_spec_")
    ]
    assert {s.labels["replica"] for s in samples} == {str(drafting.pk)}
    value = {(s.name, s.labels.get("position")): s.value for s in samples}
    assert value == {
        ("switchyard_spec_drafts_total", None): 10,
        ("switchyard_spec_verify_steps_total", None): 10,
        ("switchyard_spec_verify_seconds_total", None): 1.25,
        ("switchyard_spec_draft_seconds_total", None): 0.0625,
        ("switchyard_spec_draft_tokens_total", "0"): 10,
        ("switchyard_spec_draft_tokens_total", "1"): 8,
        ("switchyard_spec_draft_tokens_total", "2"): 5,
        ("switchyard_spec_accepted_tokens_total", "0"): 7,
        ("switchyard_spec_accepted_tokens_total", "1"): 4,
        ("switchyard_spec_accepted_tokens_total", "2"): 1,
        ("switchyard_spec_mean_acceptance_length", None): 2.2,  # 1 + 12 accepted / 10 runs
    }
    assert {s.labels["deployment"] for s in samples} == {"demo"}


def test_an_auto_replica_reports_the_k_it_chose(redis, deployment):
    """Method auto (k chosen per step from measured costs): how many decoding sequences were given
    each k, 0 included, as switchyard_spec_chosen_k_total{k}; a fixed-k replica has no such series."""
    auto, fixed = replica(deployment), replica(deployment)
    gain = {"expected_plain": 3.0, "expected": 2.0, "measured_plain": 2.4, "measured": 2.0}
    report(
        redis,
        auto,
        "a",
        spec={**speculative(4, [4, 3], [2, 1]), "method": "auto", "chosen_k": [9, 1, 3], "gain_seconds": gain},
    )
    report(redis, fixed, "b", spec=speculative(4, [4, 3], [2, 1]))
    samples = [
        s
        for f in text_string_to_metric_families(render(redis))
        for s in f.samples
        if s.name == "switchyard_spec_chosen_k_total"
    ]
    assert {(s.labels["replica"], s.labels["k"]): s.value for s in samples} == {
        (str(auto.pk), "0"): 9,
        (str(auto.pk), "1"): 1,
        (str(auto.pk), "2"): 3,
    }
    # what the choice expected of the steps it drafted in, and what they gave
    samples = [s for f in text_string_to_metric_families(render(redis)) for s in f.samples]
    speedups = {s.name: (s.labels["replica"], s.value) for s in samples if s.name.endswith("_speedup")}
    assert speedups == {
        "switchyard_spec_expected_speedup": (str(auto.pk), 1.5),
        "switchyard_spec_measured_speedup": (str(auto.pk), 1.2),
    }
    seconds = {
        (s.labels["basis"], s.labels["side"]): s.value
        for s in samples
        if s.name == "switchyard_spec_gain_seconds_total"
    }
    assert seconds == {
        ("expected", "plain"): 3.0,
        ("expected", "spent"): 2.0,
        ("measured", "plain"): 2.4,
        ("measured", "spent"): 2.0,
    }


def test_a_replica_that_drafted_nothing_yet_has_no_acceptance_length(redis, deployment):
    report(redis, replica(deployment), "a", spec=speculative(0, [0, 0], [0, 0]))
    names = {s.name for f in text_string_to_metric_families(render(redis)) for s in f.samples}
    assert "switchyard_spec_drafts_total" in names and "switchyard_spec_mean_acceptance_length" not in names


def test_a_point_shows_the_deployments_speculation_and_this_seconds_acceptance(redis, deployment):
    one, two = replica(deployment), replica(deployment)
    report(redis, one, "a", spec=speculative(10, [10, 8, 5], [7, 4, 1]))
    report(redis, two, "b", spec=speculative(10, [10, 9, 9], [5, 2, 0]))
    first = sample(redis, now=1000.0)["demo"]
    assert first["spec_acceptance_length"] is None  # nothing to compare with yet
    assert first["speculation"] == {
        "num_drafts": 20,
        "drafted_per_position": [20, 17, 14],
        "accepted_per_position": [12, 6, 1],
        "verify_seconds": 0.0,
        "draft_seconds": 0.0,
        "mean_acceptance_length": 1.95,
        "acceptance_per_position": [0.6, 0.3, 0.05],
    }
    report(redis, one, "a", spec=speculative(14, [14, 12, 9], [11, 8, 4]))  # 4 runs, 11 accepted since
    p = sample(redis, now=1001.0)["demo"]
    assert p["spec_acceptance_length"] == 3.75
    assert p["speculation"]["num_drafts"] == 24


def test_a_deployment_without_speculation_has_none_in_its_points(redis, deployment):
    r = replica(deployment)
    report(redis, r, "a", tokens=5)
    sample(redis, now=1.0)
    report(redis, r, "a", tokens=9)
    p = sample(redis, now=2.0)["demo"]
    assert (p["speculation"], p["spec_acceptance_length"]) == (None, None)


def tier_stats(dram_loaded=0, store_loaded=0, store_up=True, **dram) -> dict:
    """An engine's tier_stats() with a DRAM tier and the store (workers/engine/tiered_cache.py)."""
    counts = dict.fromkeys(("hits", "misses", "bytes_read", "bytes_written", "checksum_failures", "errors",
                            "evictions", "used_bytes", "capacity_bytes"), 0)  # fmt: skip
    return {
        "tiers": {
            "dram": {**counts, "read_seconds": 0.0, "write_seconds": 0.0, "available": True, **dram},
            "store": {**counts, "read_seconds": 0.0, "write_seconds": 0.0, "available": store_up},
        },
        "blocks_loaded": {"dram": dram_loaded, "store": store_loaded, "disk": 0},  # the engine counts every kind
        "load_seconds": 0.5,
        "dropped_writes": 2,
        "loads_inflight": 1,
    }


def test_kv_tiers_are_rendered_per_tier_for_replicas_that_have_them(redis, deployment):
    tiered, plain = replica(deployment), replica(deployment)
    report(redis, tiered, "a", tiers=tier_stats(dram_loaded=7, store_loaded=3, store_up=False, hits=9, misses=4,
                                                bytes_read=9 * 4096, checksum_failures=1, used_bytes=65536,
                                                capacity_bytes=1 << 20, read_seconds=0.25))  # fmt: skip
    report(redis, plain, "b")
    samples = [
        s
        for f in text_string_to_metric_families(render(redis))
        for s in f.samples
        if s.name.startswith("switchyard_kv_tier_")
    ]
    assert {s.labels["replica"] for s in samples} == {str(tiered.pk)}
    value = {(s.name, s.labels.get("tier")): s.value for s in samples}
    assert value[("switchyard_kv_tier_hits_total", "dram")] == 9
    assert value[("switchyard_kv_tier_misses_total", "dram")] == 4
    assert value[("switchyard_kv_tier_read_bytes_total", "dram")] == 9 * 4096
    assert value[("switchyard_kv_tier_read_seconds_total", "dram")] == 0.25
    assert value[("switchyard_kv_tier_checksum_failures_total", "dram")] == 1
    assert value[("switchyard_kv_tier_used_bytes", "dram")] == 65536
    assert value[("switchyard_kv_tier_capacity_bytes", "dram")] == 1 << 20
    assert (value[("switchyard_kv_tier_available", "dram")], value[("switchyard_kv_tier_available", "store")]) == (1, 0)
    # Blocks loaded for the tiers the replica has, not every kind the engine counts.
    assert {k: v for k, v in value.items() if k[0] == "switchyard_kv_tier_blocks_loaded_total"} == {
        ("switchyard_kv_tier_blocks_loaded_total", "dram"): 7,
        ("switchyard_kv_tier_blocks_loaded_total", "store"): 3,
    }
    whole = [
        value[(f"switchyard_kv_tier_{name}", None)]
        for name in ("load_seconds_total", "dropped_writes_total", "loads_inflight")
    ]
    assert whole == [0.5, 2, 1]
    families = {f.name: f.type for f in text_string_to_metric_families(render(redis))}
    assert families["switchyard_kv_tier_hits"] == "counter" and families["switchyard_kv_tier_used_bytes"] == "gauge"


def test_each_ranks_memory_is_rendered_by_kind(redis, deployment):
    r = replica(deployment)
    ranks = [{"rank": i, "weights": 100 + i, "kv_cache": 200 + i, "other": 30 + i} for i in range(2)]
    report(redis, r, "a", rank_memory=ranks)
    samples = [
        s
        for f in text_string_to_metric_families(render(redis))
        for s in f.samples
        if s.name == "switchyard_replica_rank_memory_bytes"
    ]
    value = {(s.labels["rank"], s.labels["kind"]): s.value for s in samples}
    assert value == {("0", "weights"): 100, ("0", "kv_cache"): 200, ("0", "other"): 30,
                     ("1", "weights"): 101, ("1", "kv_cache"): 201, ("1", "other"): 31}  # fmt: skip


def test_a_point_shows_the_hit_rate_by_cache_tier_since_the_replicas_started(redis, deployment):
    tiered, plain = replica(deployment), replica(deployment)
    report(redis, tiered, "a", hits=20, queries=100, tiers=tier_stats(dram_loaded=30, store_loaded=10))
    report(redis, plain, "b", hits=10, queries=100)
    p = sample(redis, now=1000.0)["demo"]
    assert p["cache_tiers"] == {
        "queries": 200,
        "blocks": {"device": 30, "dram": 30, "store": 10},
        "hit_rate": {"device": 0.15, "dram": 0.15, "store": 0.05},
    }
    # Both restarted and have looked nothing up since: no rate to show, rather than 0%.
    report(redis, tiered, "c", tiers=tier_stats())
    report(redis, plain, "d")
    assert sample(redis, now=1001.0)["demo"]["cache_tiers"]["hit_rate"] == {"device": None, "dram": None, "store": None}
