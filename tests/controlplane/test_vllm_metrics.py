"""`/metrics` under vLLM's names (controlplane/telemetry/vllm_names.py), checked against the
names, types and labels of vLLM's documentation ("Production Metrics", V1), from a replica's
heartbeat as a replica writes it (workers/replica/server.py)."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.catalog.models import Model
from controlplane.common import redis as redis_client
from controlplane.deployments.models import Deployment, Replica
from controlplane.telemetry.prometheus import render
from workers.protocol import replica as protocol
from workers.replica.metrics import ReplicaMetrics

# From vLLM's documentation: metric -> type (counters as their families, without `_total`).
VLLM = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:spec_decode_num_drafts": "counter",
    "vllm:spec_decode_num_draft_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "counter",
}
BLOCK = 16


@pytest.fixture
def replica(db):
    model = Model.objects.create(name="tiny", source="/models/tiny")
    return Replica.objects.create(deployment=Deployment.objects.create(slug="chat", model=model), state="ready")


def heartbeat(r: Replica) -> ReplicaMetrics:
    """A replica's heartbeat with a request served: what workers/replica/server.py writes."""
    metrics = ReplicaMetrics()
    metrics.token(arrived=0.0, last=None, now=0.2)  # first token 0.2 s after arrival
    metrics.token(arrived=0.0, last=0.2, now=0.25)
    metrics.finished(prompt_tokens=40, cached_tokens=16)
    metrics.phases(queue=0.05, prefill=0.15, decode=0.05)
    load = {"running": 3, "waiting": 2, "kv_blocks_total": 100, "kv_blocks_free": 75, "prefix_cache_hits": 1,
            "prefix_cache_queries": 2, "preemptions": 4}  # fmt: skip
    spec = {"method": "ngram", "num_drafts": 10, "drafted_per_position": [10, 6], "accepted_per_position": [7, 2]}
    client = redis_client.client()
    client.hset(protocol.status_key(r.pk), mapping={
        "state": "ready", "load": protocol.encode(load), "heartbeat": f"{time.time():.3f}", "incarnation": "a",
        "metrics": protocol.encode({"deployment": "chat", **metrics.as_dict(), "speculative": spec}),
        "kv_block_size": str(BLOCK),
    })  # fmt: skip
    return metrics


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")}


def test_every_documented_vllm_metric_is_exported_with_its_type_and_model_name(replica):
    heartbeat(replica)
    got = families(render(redis_client.client()))
    assert {name: f.type for name, f in got.items()} == VLLM
    for family in got.values():
        assert family.samples
        for sample in family.samples:
            assert sample.labels["model_name"] == "chat" and sample.labels["engine"] == str(replica.pk)


def test_the_values_mean_what_vllm_means(replica):
    heartbeat(replica)
    value = {
        (s.name, s.labels.get("position"), s.labels.get("le")): s.value
        for f in families(render(redis_client.client())).values()
        for s in f.samples
    }
    assert value[("vllm:num_requests_running", None, None)] == 3
    assert value[("vllm:num_requests_waiting", None, None)] == 2
    assert value[("vllm:kv_cache_usage_perc", None, None)] == 0.25  # a fraction, 1 = full
    assert value[("vllm:prefix_cache_queries_total", None, None)] == 2 * BLOCK  # tokens, not blocks
    assert value[("vllm:prefix_cache_hits_total", None, None)] == BLOCK
    assert value[("vllm:prompt_tokens_total", None, None)] == 40
    assert value[("vllm:generation_tokens_total", None, None)] == 2
    assert value[("vllm:num_preemptions_total", None, None)] == 4
    assert value[("vllm:time_to_first_token_seconds_count", None, None)] == 1
    assert value[("vllm:time_to_first_token_seconds_sum", None, None)] == pytest.approx(0.2)
    assert value[("vllm:request_queue_time_seconds_sum", None, None)] == pytest.approx(0.05)
    assert value[("vllm:request_prefill_time_seconds_sum", None, None)] == pytest.approx(0.15)
    assert value[("vllm:request_decode_time_seconds_sum", None, None)] == pytest.approx(0.05)
    assert value[("vllm:e2e_request_latency_seconds_sum", None, None)] == pytest.approx(0.25)
    assert value[("vllm:spec_decode_num_drafts_total", None, None)] == 10
    assert value[("vllm:spec_decode_num_draft_tokens_total", None, None)] == 16
    assert value[("vllm:spec_decode_num_accepted_tokens_total", None, None)] == 9
    assert value[("vllm:spec_decode_num_accepted_tokens_per_pos_total", "1", None)] == 2
