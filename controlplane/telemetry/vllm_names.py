"""The replicas' metrics again under vLLM's names, beside the `switchyard_*` series, so that the
tools operators already run read them unchanged: vLLM's and production-stack's Grafana
dashboards, KEDA triggers on `vllm:num_requests_waiting`, the Gateway API Inference Extension's
model-server protocol (`vllm:kv_cache_usage_perc`, `vllm:num_requests_waiting`), llm-d's
autoscaler. Names, types and meanings are vLLM's (V1); labels `model_name` (the deployment, the
name clients send) and `engine` (the replica). Counters are written as prometheus_client writes
them, with `_total` (vLLM's `vllm:prompt_tokens` is scraped as `vllm:prompt_tokens_total`).
vLLM counts prefix-cache queries and hits in tokens: a replica's block counts times its block size.
"""

from __future__ import annotations

GAUGES = (
    ("vllm:num_requests_running", "Number of requests in model execution batches.", "running"),
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "waiting"),
)
COUNTERS = (  # from the replica's serving metrics
    ("vllm:prompt_tokens_total", "Number of prefill tokens processed.", "prompt_tokens"),
    ("vllm:generation_tokens_total", "Number of generation tokens processed.", "generation_tokens"),
)
HISTOGRAMS = (
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft_seconds"),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl_seconds"),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e_seconds"),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", "queue_seconds"),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", "prefill_seconds"),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", "decode_seconds"),
)
PREFIX_CACHE = (
    (
        "vllm:prefix_cache_queries_total",
        "Prefix cache queries, in terms of number of queried tokens.",
        "prefix_cache_queries",
    ),
    ("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", "prefix_cache_hits"),
)
PREEMPTIONS = ("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.")
KV_USAGE = ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
SPEC_DRAFTS = ("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.")
SPEC_DRAFT_TOKENS = ("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.")
SPEC_ACCEPTED = ("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.")
SPEC_PER_POS = ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "Accepted tokens per draft position.")


def add_vllm_series(exp, slug: str, replica_id: int, status) -> None:
    """One replica's series under vLLM's names (`exp`: prometheus.Exposition)."""
    labels = {"model_name": slug, "engine": replica_id}
    load, metrics = status.load, status.metrics
    for name, help_text, key in GAUGES:
        if key in load:
            exp.add(name, "gauge", help_text, labels, load[key])
    total, free = load.get("kv_blocks_total"), load.get("kv_blocks_free")
    if total:
        exp.add(KV_USAGE[0], "gauge", KV_USAGE[1], labels, round(1 - (free or 0) / total, 6))
    block = status.kv_block_size or 1
    for name, help_text, key in PREFIX_CACHE:
        if key in load:
            exp.add(name, "counter", help_text, labels, load[key] * block)
    if "preemptions" in load:
        exp.add(PREEMPTIONS[0], "counter", PREEMPTIONS[1], labels, load["preemptions"])
    for name, help_text, key in COUNTERS:
        if key in metrics:
            exp.add(name, "counter", help_text, labels, metrics[key])
    for name, help_text, key in HISTOGRAMS:
        if isinstance(metrics.get(key), dict):
            exp.histogram(name, help_text, labels, metrics[key])
    spec = metrics.get("speculative")
    if isinstance(spec, dict):
        drafted, accepted = spec.get("drafted_per_position") or [], spec.get("accepted_per_position") or []
        exp.add(SPEC_DRAFTS[0], "counter", SPEC_DRAFTS[1], labels, spec.get("num_drafts", 0))
        exp.add(SPEC_DRAFT_TOKENS[0], "counter", SPEC_DRAFT_TOKENS[1], labels, sum(drafted))
        exp.add(SPEC_ACCEPTED[0], "counter", SPEC_ACCEPTED[1], labels, sum(accepted))
        for position, count in enumerate(accepted):
            exp.add(SPEC_PER_POS[0], "counter", SPEC_PER_POS[1], labels, count, extra={"position": position})
