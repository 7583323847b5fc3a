"""A replica process (the real engine, and the simulated one: workers/sim) survives a burst of bad
requests: each is answered with an error event of its own, naming the parameter without internal
text, while a request already streaming and one sent after the burst both finish. The messages
go straight onto the replica's stream, as a buggy or older gateway could send them (the
gateway's own checks are tested in tests/controlplane/test_bad_input.py)."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import redis
from django.conf import settings

from tests.support.stack import wait_for
from workers.bench.processes import start_replica
from workers.protocol import replica as protocol
from workers.protocol.replica import ReplicaSpec

pytestmark = pytest.mark.timeout(180)
REPLICA = 9201
GOOD = {"temperature": 0.0, "max_tokens": 24, "ignore_eos": True}

# (what the message carries besides id and reply_to, the param the error must name)
BAD = [
    ({"prompt_token_ids": [5, 6], "params": {"seed": 2**64}}, "seed"),
    ({"prompt_token_ids": [5, 6], "params": {"seed": -1}}, "seed"),
    ({"prompt_token_ids": [5, 6], "params": {"temperature": "hot"}}, "temperature"),
    ({"prompt_token_ids": [5, 6], "params": {"top_k": 1.5}}, "top_k"),
    ({"prompt_token_ids": [5, 6], "params": {"max_tokens": 10**30}}, None),  # huge but valid: accepted
    ({"prompt_token_ids": [5, 6], "params": {"logprobs": 10**6}}, "logprobs"),
    ({"prompt_token_ids": [5, 6], "params": {"stop": [1, 2]}}, "stop"),
    ({"prompt_token_ids": [5, 6], "params": {"best_of": 3}}, "best_of"),
    ({"prompt_token_ids": [5, 6], "params": ["not", "a", "dict"]}, "params"),
    ({"prompt_token_ids": ["x"], "params": {}}, "prompt"),
    ({"prompt_token_ids": [10**12], "params": {}}, "prompt"),
    ({"prompt_token_ids": [], "params": {}}, "prompt"),
    ({"messages": [{"role": "user", "content": {"nested": True}}], "params": {"temperature": -1}}, "temperature"),
    ({"prompt_token_ids": [5, 6], "prefill": ["not", "a", "dict"], "params": {"min_p": 2}}, "min_p"),
    ({"prompt_token_ids": [5, 6], "resume": [2], "params": {}}, "resume"),
    ({"prompt_token_ids": [5, 6], "resume": {"output_tokens": 2}, "params": {}}, "resume"),  # no prompt left
    ({"prompt_token_ids": [5, 6], "resume": {"output_tokens": 1, "text_sent": -1}, "params": {}}, "resume"),
    ({"prompt_token_ids": [5, 6], "resume": {"output_tokens": "1"}, "params": {}}, "resume"),
]


@pytest.fixture(scope="module", params=["real", "sim"])
def replica(request, model_dir, tmp_path_factory):
    state = tmp_path_factory.mktemp("bad-input")
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    client.delete(protocol.status_key(REPLICA), protocol.requests_key(REPLICA))
    spec = ReplicaSpec(replica_id=REPLICA, deployment="bad-input", model_dir=str(model_dir), model_name="tiny",
                       engine=request.param, dtype="float32", block_size=4, threads=1, redis_url=settings.REDIS_URL,
                       kv_cache_bytes=16 << 20)  # fmt: skip
    process, log = start_replica(spec, state)
    try:
        wait_for(lambda: client.hget(protocol.status_key(REPLICA), "state") == "ready", 90, "the replica")
        yield {"redis": client, "process": process, "log": state / f"replica-{REPLICA}.log"}
    finally:
        process.kill()
        process.wait()
        log.close()


def send(client, channel: str, body: dict) -> str:
    rid = f"t-{uuid.uuid4().hex[:8]}"
    message = {"type": "generate", "id": rid, "reply_to": channel, **body}
    client.xadd(protocol.requests_key(REPLICA), {"m": json.dumps(message)})
    return rid


def test_a_burst_of_bad_requests_hurts_no_other_request(replica):
    client = replica["redis"]
    channel, pubsub = f"test-reply-{uuid.uuid4().hex[:8]}", client.pubsub()
    pubsub.subscribe(channel)
    pubsub.get_message(timeout=1)

    first = send(client, channel, {"prompt_token_ids": list(range(5, 30)), "params": GOOD})
    bad = {send(client, channel, body): param for body, param in BAD}
    last = send(client, channel, {"prompt_token_ids": list(range(5, 30)), "params": GOOD})

    events: dict[str, list[dict]] = {}
    done: set[str] = set()
    deadline = time.monotonic() + 60
    while len(done) < len(bad) + 2 and time.monotonic() < deadline:
        m = pubsub.get_message(timeout=1)
        if not (m and m["type"] == "message"):
            continue
        event = json.loads(m["data"])
        events.setdefault(event["id"], []).append(event)
        if event["type"] == "error" or event.get("finish_reason"):
            done.add(event["id"])
        elif event["type"] == "accepted" and event["id"] in bad and bad[event["id"]] is None:
            client.xadd(protocol.requests_key(REPLICA), {"m": json.dumps({"type": "abort", "id": event["id"]})})
            done.add(event["id"])  # the huge-but-valid one: accepted, then dropped
    pubsub.close()

    for rid in (first, last):
        tokens = [t for e in events[rid] if e["type"] == "delta" for t in e["token_ids"]]
        assert events[rid][-1]["finish_reason"] == "length" and len(tokens) == GOOD["max_tokens"], events[rid][-2:]
    for rid, param in bad.items():
        if param is None:
            assert events[rid][0]["type"] == "accepted"
            continue
        (error,) = events[rid]
        assert error["type"] == "error" and error["status"] == 400, error
        assert error["param"] == param, error
        for internal in ("Traceback", "Error:", "unpacking", "__init__", "got an unexpected keyword"):
            assert internal not in error["message"], error
    assert replica["process"].poll() is None  # alive, and still ready
    assert client.hget(protocol.status_key(REPLICA), "state") == "ready"
