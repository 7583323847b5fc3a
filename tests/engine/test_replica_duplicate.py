"""A `generate` that reaches a replica twice (the gateway retries a send whose Redis connection
dropped, and the first one had gone through) runs once: the duplicate is dropped silently, neither
admitted as a second sequence nor refused with an error that would end the client's request."""

import os

from workers.engine import LLM
from workers.protocol.replica import AcceptedEvent, ErrorEvent, ReplicaSpec
from workers.replica.server import ReplicaServer


def test_a_generate_received_twice_is_admitted_once(llama_dir):
    llm = LLM(str(llama_dir), device="cpu", dtype="float32", block_size=4, max_model_len=64, num_kv_blocks=64)
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    spec = ReplicaSpec(replica_id=9321, deployment="dup", model_dir=str(llama_dir), model_name="tiny", redis_url=url)
    server = ReplicaServer(spec, llm.engine)
    message = {
        "type": "generate",
        "id": "dup-1",
        "reply_to": "switchyard:test:dup",
        "prompt_token_ids": [5, 6, 7],
        "params": {"temperature": 0.0, "max_tokens": 3, "ignore_eos": True},
    }
    server._admit(dict(message))
    server._admit(dict(message))
    accepted = [event for _, event in server._pending if isinstance(event, AcceptedEvent)]
    assert [event.id for event in accepted] == ["dup-1"]
    # and no error either: the gateway would end the client's request with it
    assert [event for _, event in server._pending if isinstance(event, ErrorEvent)] == []
    assert list(server.inflight) == ["dup-1"]
    outputs = []
    while llm.engine.has_unfinished_requests():
        outputs += llm.engine.step()
    assert {out.request_id for out in outputs} == {"dup-1"}
    assert sum(len(out.new_token_ids) for out in outputs) == 3  # one sequence's tokens, not two
