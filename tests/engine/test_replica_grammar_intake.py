"""A replica compiles a request's grammar on its intake thread, before the main loop sees the
request: compiled on the loop, the first grammar (xgrammar's import, a second of CPU, several on
a loaded machine) held a pass long enough for the heartbeat to go stale, and the gateway took the
replica for dead and ended every stream on it. A grammar that does not compile is still
answered by the loop with a 400 naming it."""

import os
import uuid

import redis

from workers.engine import LLM
from workers.protocol import replica as protocol
from workers.protocol.replica import AcceptedEvent, ErrorEvent, ReplicaSpec
from workers.replica.server import ReplicaServer

SCHEMA = {"type": "json_schema", "schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
BROKEN = {"type": "grammar", "grammar": "root ::= ("}


def generate(rid: str, grammar: dict) -> dict:
    params = {"temperature": 0.0, "max_tokens": 4, "grammar": grammar}
    return {"type": "generate", "id": rid, "reply_to": f"switchyard:test:{rid}", "prompt_token_ids": [5, 6, 7],
            "params": params}  # fmt: skip


def test_the_intake_thread_compiles_a_grammar_before_the_loop_admits_it(llama_dir):
    llm = LLM(str(llama_dir), device="cpu", dtype="float32", block_size=4, max_model_len=64, num_kv_blocks=64)
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    replica_id = 9000 + uuid.uuid4().int % 900
    spec = ReplicaSpec(replica_id=replica_id, deployment="intake", model_dir=str(llama_dir), model_name="tiny",
                       redis_url=url)  # fmt: skip
    server = ReplicaServer(spec, llm.engine)
    client = redis.Redis.from_url(url, decode_responses=True)
    stream = protocol.requests_key(replica_id)
    client.delete(stream)
    grammars = llm.engine.grammars
    try:
        for message in (generate("schema", SCHEMA), generate("broken", BROKEN)):
            client.xadd(stream, {"m": protocol.encode(message)})
        server.last_id = "0-0"
        intake = server._start_intake()
        received = [server.incoming.get(timeout=60) for _ in range(2)]
        # Both read; the good one compiled there, the broken one left to the loop.
        assert [m["id"] for m in received] == ["schema", "broken"]
        assert grammars.compiles == 1 and len(grammars.cache) == 1
        for message in received:
            server._admit(message)
        assert grammars.compiles == 1, "the loop found the grammar compiled"
        events = {event.id: event for _, event in server._pending}
        assert isinstance(events["schema"], AcceptedEvent)
        broken = events["broken"]
        assert isinstance(broken, ErrorEvent) and broken.status == 400 and "cannot compile" in broken.message
        assert broken.param == "structured_outputs"
    finally:
        server._stopping.set()
        client.delete(stream)
        client.close()
    intake.join(timeout=10)
    assert not intake.is_alive()
