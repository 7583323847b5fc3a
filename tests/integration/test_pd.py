"""Prefill/decode disaggregation between real replica processes: KV blocks move with the
Mooncake Transfer Engine over TCP on loopback; requests and tokens go through Redis exactly as
the gateway sends them. Failures are caused for real: a stopped (SIGSTOP) prefill replica, a
killed one, and a decode replica whose KV layout differs."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid

import pytest
import redis
from django.conf import settings

from tests.support.freeze import freeze
from tests.support.stack import wait_for
from workers.bench.processes import start_replica
from workers.protocol import replica as protocol
from workers.protocol.replica import ReplicaSpec

pytestmark = pytest.mark.timeout(240)
TIMEOUT = 1.0  # the decode replica's KV transfer timeout in these tests
PREFILL, DECODE, MISMATCHED, COLOCATED = 9101, 9102, 9103, 9104
LONG = list(range(20, 120))  # 100 tokens: 25 blocks of 4
PROMPTS = [LONG, [5, 9, 33, 100, 7, 8, 9, 10, 11], [*range(20, 60), 3, 3, 3]]  # the third shares LONG's prefix


@pytest.fixture(scope="module")
def replicas(model_dir, tmp_path_factory):
    state = tmp_path_factory.mktemp("pd")
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    procs: dict[int, subprocess.Popen] = {}
    logs = {}

    def start(rid: int, role: str, block_size: int = 4) -> None:
        client.delete(protocol.status_key(rid), protocol.requests_key(rid))
        spec = ReplicaSpec(replica_id=rid, deployment="pd", model_dir=str(model_dir), model_name="tiny", role=role,
                           dtype="float32", block_size=block_size, threads=1, redis_url=settings.REDIS_URL,
                           kv_transfer_timeout=TIMEOUT, kv_cache_bytes=16 << 20,
                           local_prefill_tokens=0)  # fmt: skip
        procs[rid], logs[rid] = start_replica(spec, state)

    try:
        start(PREFILL, "prefill")
        start(DECODE, "decode")
        start(MISMATCHED, "decode", block_size=8)
        start(COLOCATED, "colocated")
        for rid in procs:
            wait_for(lambda rid=rid: client.hget(protocol.status_key(rid), "state") == "ready", 90, f"replica {rid}")
        yield {"redis": client, "procs": procs}
    finally:  # also when a replica never got ready: the others are not left running
        for p in procs.values():
            p.kill()
            p.wait()
        for f in logs.values():
            f.close()


def generate(client, replica: int, prompt: list[int], prefill: int | None = None, max_tokens: int = 10, **params):
    """Send one request like the gateway does; returns (events, seconds). `params` override the
    sampling parameters (greedy, one token's logprobs)."""
    rid, channel = f"t-{uuid.uuid4().hex[:8]}", f"test-reply-{uuid.uuid4().hex[:8]}"
    pubsub = client.pubsub()
    pubsub.subscribe(channel)
    pubsub.get_message(timeout=1)
    message = {
        "type": "generate",
        "id": rid,
        "reply_to": channel,
        "prompt_token_ids": prompt,
        "params": {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True, "logprobs": 1, **params},
    }
    if prefill is not None:
        message["prefill"] = {"replica_id": prefill}
    started = time.monotonic()
    client.xadd(protocol.requests_key(replica), {"m": json.dumps(message)})
    events = []
    while time.monotonic() - started < 30:
        m = pubsub.get_message(timeout=1)
        if m and m["type"] == "message":
            events.append(json.loads(m["data"]))
            finished = sum(1 for e in events if e.get("finish_reason"))
            if events[-1]["type"] == "error" or finished == params.get("n", 1):
                break
    pubsub.close()
    assert events and events[-1].get("finish_reason") == "length", events[-3:]
    return events, time.monotonic() - started


def tokens(events) -> list[int]:
    return [t for e in events if e["type"] == "delta" for t in e["token_ids"]]


def kv_stats(client, rid: int) -> dict:
    return json.loads(client.hget(protocol.status_key(rid), "load"))["kv_transfer"]


def test_disaggregated_output_equals_colocated_and_reuses_the_prefill_cache(replicas):
    client = replicas["redis"]
    for prompt in PROMPTS:
        colocated, _ = generate(client, COLOCATED, prompt)
        disagg, _ = generate(client, DECODE, prompt, prefill=PREFILL)
        assert tokens(disagg) == tokens(colocated)
        for a, b in zip(disagg[1:], colocated[1:], strict=True):  # logprobs of each token, too
            assert a["logprobs"][0]["logprob"] == pytest.approx(b["logprobs"][0]["logprob"], abs=1e-4)
        final = disagg[-1]
        assert "fallback" not in final.get("disaggregation", {}), final
        assert final["disaggregation"]["prefill"]["replica"] == PREFILL
        assert final["usage"]["prompt_tokens"] == len(prompt)
    # The third prompt's first 40 tokens were cached on the prefill side (10 blocks of 4).
    assert final["usage"]["cached_tokens"] == 40
    for rid in (PREFILL, DECODE):  # metrics come with the next heartbeat (every 0.5 s)
        wait_for(lambda rid=rid: kv_stats(client, rid)["handoffs"] >= 3, 5, f"replica {rid}'s metrics")
    sent, received = kv_stats(client, PREFILL), kv_stats(client, DECODE)
    blocks = sum(-(-len(p) // 4) for p in PROMPTS)
    assert sent["blocks_sent"] == received["blocks_received"] == blocks
    assert sent["bytes_sent"] == received["bytes_received"] > 0
    assert received["fallbacks"] == 0


def test_n_samples_are_prefilled_once_and_forked_on_the_decode_replica(replicas):
    client = replicas["redis"]
    before = kv_stats(client, DECODE)["handoffs"]
    for params in ({"n": 3}, {"n": 3, "temperature": 1.0, "seed": 9}):
        colocated, _ = generate(client, COLOCATED, PROMPTS[1], **params)
        disagg, _ = generate(client, DECODE, PROMPTS[1], prefill=PREFILL, **params)
        for index in range(3):
            mine = [t for e in disagg if e["type"] == "delta" and e.get("index", 0) == index for t in e["token_ids"]]
            want = [t for e in colocated if e["type"] == "delta" and e.get("index", 0) == index for t in e["token_ids"]]
            assert mine == want and len(mine) == 10
        final = [e for e in disagg if e.get("finish_reason")]
        assert all(e["disaggregation"]["prefill"]["replica"] == PREFILL for e in final if e.get("disaggregation"))
    wait_for(lambda: kv_stats(client, DECODE)["handoffs"] >= before + 2, 5, "the decode replica's metrics")
    assert kv_stats(client, DECODE)["handoffs"] == before + 2  # one handoff per request, not per sample


def test_a_layout_mismatch_is_refused_and_the_decode_replica_prefills_itself(replicas):
    client = replicas["redis"]
    colocated, _ = generate(client, COLOCATED, LONG)
    events, seconds = generate(client, MISMATCHED, LONG, prefill=PREFILL)
    assert tokens(events) == tokens(colocated)
    reason = events[-1]["disaggregation"]["fallback"]
    assert "KV layouts differ" in reason and "block_size: 4 here, 8 there" in reason
    assert seconds < TIMEOUT  # refused at once, not timed out


def test_a_stopped_prefill_replica_times_out_into_a_local_prefill(replicas):
    client, prefill = replicas["redis"], replicas["procs"][PREFILL]
    colocated, _ = generate(client, COLOCATED, LONG)
    try:
        freeze(prefill.pid)
        events, seconds = generate(client, DECODE, LONG, prefill=PREFILL)
    finally:
        prefill.send_signal(signal.SIGCONT)
    assert tokens(events) == tokens(colocated)
    assert "no KV from prefill replica" in events[-1]["disaggregation"]["fallback"]
    assert TIMEOUT <= seconds < TIMEOUT + 5.0  # timed out, then prefilled here (bounded: CI is slow)
    # Woken up, the prefill replica refuses the stale request (deadline passed), the decode
    # replica frees the quarantined blocks, and handoffs work again.
    again, _ = generate(client, DECODE, LONG, prefill=PREFILL)
    assert tokens(again) == tokens(colocated) and "fallback" not in again[-1]["disaggregation"]
    wait_for(lambda: kv_stats(client, DECODE)["fallbacks"] >= 1, 5, "the fallback to be counted")


def test_a_killed_prefill_replica_does_not_hang_requests(replicas):
    client, prefill = replicas["redis"], replicas["procs"][PREFILL]
    colocated, _ = generate(client, COLOCATED, LONG)
    prefill.kill()
    prefill.wait()
    events, seconds = generate(client, DECODE, LONG, prefill=PREFILL)
    assert tokens(events) == tokens(colocated)
    assert "fallback" in events[-1]["disaggregation"]
    assert seconds < TIMEOUT + 5.0
    free = json.loads(client.hget(protocol.status_key(DECODE), "load"))["kv_blocks_free"]
    assert free > 0


def test_sigterm_drains_a_replica_in_flight_work_finishes_new_work_is_refused(replicas):
    client, proc = replicas["redis"], replicas["procs"][COLOCATED]
    pubsub = client.pubsub()
    pubsub.subscribe("drain-test")
    pubsub.get_message(timeout=1)
    long = {
        "type": "generate",
        "id": "long",
        "reply_to": "drain-test",
        "prompt_token_ids": LONG,
        "params": {"temperature": 0.0, "max_tokens": 800, "ignore_eos": True},
    }
    client.xadd(protocol.requests_key(COLOCATED), {"m": json.dumps(long)})
    first = None
    while first is None:  # wait until it is running
        m = pubsub.get_message(timeout=5)
        assert m is not None, "no answer from the replica"
        if m["type"] == "message" and json.loads(m["data"])["type"] == "delta":
            first = m
    proc.send_signal(signal.SIGTERM)
    late = {**long, "id": "late", "params": {"max_tokens": 2}}
    wait_for(lambda: client.hget(protocol.status_key(COLOCATED), "state") == "draining", 5, "draining state")
    client.xadd(protocol.requests_key(COLOCATED), {"m": json.dumps(late)})
    finished, refused = None, None
    deadline = time.monotonic() + 30
    while (finished is None or refused is None) and time.monotonic() < deadline:
        m = pubsub.get_message(timeout=1)
        if m and m["type"] == "message":
            event = json.loads(m["data"])
            if event["id"] == "long" and event.get("finish_reason"):
                finished = event
            if event["id"] == "late":
                refused = event
    # (800 tokens take seconds: the late request surely arrives while the long one still runs.)
    assert finished["finish_reason"] == "length" and finished["usage"]["completion_tokens"] == 800
    assert refused["type"] == "error" and refused["status"] == 503
    assert proc.wait(timeout=10) == 0
    assert client.hget(protocol.status_key(COLOCATED), "state") == "stopped"
