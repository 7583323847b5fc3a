"""A request the engine fails on ends alone: the replica answers it with one error event (500,
code `engine_error`, naming the request) however many samples it has, counts it, and the requests
stepped beside it stream and finish as they would have without it. The failure is the engine's
test-only fault (workers/engine/faults.py, on with SWITCHYARD_TEST_FAULTS=1): a real exception
raised while stepping that request."""

import os

from workers.engine import LLM
from workers.protocol.replica import AcceptedEvent, DeltaEvent, ErrorEvent, ReplicaSpec
from workers.replica.server import ReplicaServer

FAULT = {"type": "regex", "regex": "switchyard-test-fault"}
PROMPTS = {"ok-1": [5, 6, 7, 8], "ok-2": [9, 10, 11]}
MAX_TOKENS = 8


def run(llama_dir, requests: dict[str, dict]) -> tuple[ReplicaServer, dict[str, list]]:
    """Admit `requests` (id -> generate fields) on a fresh replica, step until none is left; each
    request's events in order."""
    llm = LLM(str(llama_dir), device="cpu", dtype="float32", block_size=4, max_model_len=64, num_kv_blocks=64)
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    spec = ReplicaSpec(replica_id=9331, deployment="fault", model_dir=str(llama_dir), model_name="tiny", redis_url=url)
    server = ReplicaServer(spec, llm.engine)
    for rid, fields in requests.items():
        server._admit({"type": "generate", "id": rid, "reply_to": f"switchyard:test:{rid}", **fields})
    steps = 0
    while llm.engine.has_unfinished_requests():
        server.collect(llm.engine.step())
        steps += 1
        assert steps < 100
    events: dict[str, list] = {}
    for _channel, event in server._pending:
        events.setdefault(event.id, []).append(event)
    return server, events


def greedy(**extra) -> dict:
    return {"temperature": 0.0, "max_tokens": MAX_TOKENS, "ignore_eos": True, **extra}


def test_an_engine_error_ends_that_request_alone_with_one_500_naming_it(llama_dir, monkeypatch):
    alone = {rid: {"prompt_token_ids": ids, "params": greedy()} for rid, ids in PROMPTS.items()}
    _, reference = run(llama_dir, alone)
    monkeypatch.setenv("SWITCHYARD_TEST_FAULTS", "1")
    faulty = {"prompt_token_ids": [12, 13, 14], "params": greedy(grammar=FAULT, n=2, temperature=0.8, seed=1)}
    server, events = run(llama_dir, {"ok-1": alone["ok-1"], "bad-1": faulty, "ok-2": alone["ok-2"]})

    bad = events.pop("bad-1")
    assert isinstance(bad[0], AcceptedEvent)
    errors = [e for e in bad if isinstance(e, ErrorEvent)]
    assert len(errors) == 1 and bad[-1] is errors[0]  # one for both samples, and the last word
    error = errors[0]
    assert (error.status, error.code) == (500, "engine_error")
    assert "bad-1" in error.message and "injected fault" in error.message
    assert "other requests were not affected" in error.message
    assert not any(isinstance(e, DeltaEvent) and e.final for e in bad)  # no sample "finished" besides

    assert set(events) == set(reference)
    for rid, got in events.items():
        assert not any(isinstance(e, ErrorEvent) for e in got)
        tokens = [t for e in got if isinstance(e, DeltaEvent) for t in e.token_ids]
        want = [t for e in reference[rid] if isinstance(e, DeltaEvent) for t in e.token_ids]
        assert tokens == want and len(tokens) == MAX_TOKENS
        assert got[-1].finish_reason == "length"
    assert server.metrics.requests_errored == 1 and server.metrics.as_dict()["requests_errored"] == 1
    assert server.inflight == {}
