"""Prefill/decode disaggregation between parallel replicas (tp=2 pairs and pp=2 pairs: two rank
processes each, gloo): every prefill rank writes its shard of the KV blocks (its KV heads, or its
stage's layers) into the decode rank at its place, over its own Mooncake engine
(kvtransfer/ranks.py). The decode group's answer equals
the single-device colocated replica's; a single-device decode replica asking the tp=2 prefill
replica is refused at once, naming the difference, and prefills itself."""

from __future__ import annotations

import json

import pytest
import redis
from django.conf import settings

from tests.integration.test_pd import generate, kv_stats, tokens
from tests.support.stack import wait_for
from workers.bench.processes import start_replica
from workers.protocol import replica as protocol
from workers.protocol.replica import ReplicaSpec

pytestmark = pytest.mark.timeout(300)
PREFILL, DECODE, SINGLE, COLOCATED = 9201, 9202, 9203, 9204
PREFILL_PP, DECODE_PP = 9205, 9206
LONG = list(range(20, 120))  # 100 tokens: 25 blocks of 4
PROMPTS = [LONG, [*range(20, 60), 3, 3, 3]]  # the second shares LONG's first 40 tokens


@pytest.fixture(scope="module")
def replicas(model_dir, tmp_path_factory):
    state = tmp_path_factory.mktemp("pd-tp")
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    procs, logs = {}, {}

    def start(rid: int, role: str, tp: int, pp: int = 1) -> None:
        client.delete(protocol.status_key(rid), protocol.requests_key(rid))
        spec = ReplicaSpec(replica_id=rid, deployment="pd-tp", model_dir=str(model_dir), model_name="tiny", role=role,
                           dtype="float32", block_size=4, threads=1, redis_url=settings.REDIS_URL,
                           kv_transfer_timeout=10.0, kv_cache_bytes=8 << 20, local_prefill_tokens=0,
                           tensor_parallel=tp, pipeline_parallel=pp)  # fmt: skip
        procs[rid], logs[rid] = start_replica(spec, state)

    try:
        start(PREFILL, "prefill", 2)
        start(DECODE, "decode", 2)
        start(SINGLE, "decode", 1)
        start(COLOCATED, "colocated", 1)
        start(PREFILL_PP, "prefill", 1, pp=2)
        start(DECODE_PP, "decode", 1, pp=2)
        for rid in procs:
            wait_for(lambda rid=rid: client.hget(protocol.status_key(rid), "state") == "ready", 180, f"replica {rid}")
        yield client
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
        for f in logs.values():
            f.close()


@pytest.mark.parametrize(("prefill", "decode"), [(PREFILL, DECODE), (PREFILL_PP, DECODE_PP)], ids=["tp2", "pp2"])
def test_parallel_groups_move_kv_rank_to_rank_and_answer_as_one_device_does(replicas, model_dir, prefill, decode):
    client = replicas
    for prompt in PROMPTS:
        colocated, _ = generate(client, COLOCATED, prompt)
        disagg, _ = generate(client, decode, prompt, prefill=prefill)
        assert tokens(disagg) == tokens(colocated)
        for a, b in zip(disagg[1:], colocated[1:], strict=True):  # sharded sums differ in rounding only
            assert a["logprobs"][0]["logprob"] == pytest.approx(b["logprobs"][0]["logprob"], abs=1e-3)
        final = disagg[-1]
        assert "fallback" not in final.get("disaggregation", {}), final
        assert final["disaggregation"]["prefill"]["replica"] == prefill
    assert final["usage"]["cached_tokens"] == 40  # the prefill group's prefix cache served LONG's start
    for rid in (prefill, decode):
        wait_for(lambda rid=rid: kv_stats(client, rid)["handoffs"] >= 2, 5, f"replica {rid}'s metrics")
    sent, received = kv_stats(client, prefill), kv_stats(client, decode)
    blocks = sum(-(-len(p) // 4) for p in PROMPTS)
    assert sent["blocks_sent"] == received["blocks_received"] == blocks
    # every rank's shard moved: together all KV heads of every layer (K and V, fp32), no more
    cfg = json.loads((model_dir / "config.json").read_text())
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    block = 4 * cfg["num_key_value_heads"] * head_dim * 4
    assert sent["bytes_sent"] == received["bytes_received"] == blocks * cfg["num_hidden_layers"] * 2 * block
    assert received["fallbacks"] == 0


def test_a_single_device_decode_replica_is_refused_by_a_tp2_prefill_replica(replicas):
    client = replicas
    colocated, _ = generate(client, COLOCATED, LONG)
    events, seconds = generate(client, SINGLE, LONG, prefill=PREFILL)
    assert tokens(events) == tokens(colocated)
    reason = events[-1]["disaggregation"]["fallback"]
    assert "KV layouts differ" in reason and "tp_size: 2 here, 1 there" in reason, reason
    assert seconds < 10.0  # refused at once, not timed out
