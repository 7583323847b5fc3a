"""A prefill engine in its own process for the Mooncake tests: computes a prompt, writes its
KV blocks into the parent's reserved blocks, and reports the sha256 of what it sent."""

import hashlib
import time


def prefill_and_send(model_dir: str, prompt: list[int], remote: dict, remote_blocks: list[int], conn) -> None:
    from workers.engine import SamplingParams
    from workers.engine.config import EngineConfig
    from workers.engine.llm_engine import LLMEngine
    from workers.kvtransfer.mooncake import MooncakeKV

    engine = LLMEngine(EngineConfig(model=model_dir, dtype="float32", block_size=4, num_kv_blocks=64))
    kv = MooncakeKV(engine.runner.kv_cache, engine.kv_layout())
    engine.add_request("p", prompt, SamplingParams(temperature=0.0, max_tokens=1), hold_blocks=True)
    while engine.has_unfinished_requests():
        engine.step()
    local = engine.held["p"].block_table[: len(remote_blocks)]
    transfer = kv.start_write(remote, local, remote_blocks)
    deadline = time.monotonic() + 30
    while not transfer.poll():  # what the replica loop does between steps
        assert time.monotonic() < deadline, "the write did not end in 30 s"
        time.sleep(0.001)
    moved = transfer.nbytes
    digest = hashlib.sha256(engine.runner.kv_cache[:, :, local].contiguous().numpy().tobytes()).hexdigest()
    conn.send((moved, digest))
    conn.close()
