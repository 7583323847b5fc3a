"""A parallel group fails as a whole: a dead rank ends the request with an error within
seconds and no rank is left running; what a group cannot run is refused before any rank starts."""

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from workers.engine import LLM, ModelConfig, RequestError, SamplingParams
from workers.engine.config import EngineConfig
from workers.engine.parallel import ParallelConfig, ParallelError
from workers.engine.parallel.runner import split_batch
from workers.engine.scheduler import ScheduledSeq, SchedulerOutput
from workers.engine.sequence import Sequence


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) counts as gone.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def wait_gone(pids, seconds=20.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def test_a_rank_killed_mid_generation_fails_the_request_quickly(llama_dir):
    llm = LLM(str(llama_dir), dtype="float32", num_kv_blocks=64, tensor_parallel_size=2, parallel_timeout_s=10)
    pids = llm.engine.parallel_group.pids
    engine = llm.engine

    def kill_when_decoding():
        deadline = time.monotonic() + 60
        while engine.num_generated_tokens < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(pids[0], signal.SIGKILL)

    killer = threading.Thread(target=kill_when_decoding)
    killer.start()
    started = time.monotonic()
    with pytest.raises(ParallelError, match="rank 1"):
        llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=100_000, ignore_eos=True))
    failed_after = time.monotonic() - started
    killer.join()
    assert failed_after < 30  # the dead rank is seen, not waited on for ever
    assert wait_gone(pids) == []
    with pytest.raises(ParallelError, match="closed"):
        llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=2))
    # The process can start a new group once the failed one is gone.
    with LLM(str(llama_dir), dtype="float32", num_kv_blocks=64, tensor_parallel_size=2) as again:
        out = again.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=2, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == 2


def test_killing_rank_0_leaves_no_rank_behind(llama_dir, tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        from workers.engine import LLM
        if __name__ == "__main__":
            llm = LLM({str(llama_dir)!r}, dtype="float32", num_kv_blocks=16, tensor_parallel_size=2)
            print(" ".join(map(str, llm.engine.parallel_group.pids)), flush=True)
            sys.stdin.read()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 1 and alive(pids[0])
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert wait_gone(pids) == []


def config(**kw) -> ModelConfig:
    raw = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 320,
    }
    arch = kw.pop("architecture", None)  # e.g. one added to the engine before its sharding rules
    cfg = ModelConfig.from_dict({**raw, **kw})
    return dataclasses.replace(cfg, architecture=arch) if arch else cfg


@pytest.mark.parametrize(
    ("model", "engine", "parallel", "message"),
    [
        ({}, {}, {"tensor_parallel_size": 3}, "4 attention heads do not split"),
        ({"num_attention_heads": 6, "num_key_value_heads": 3}, {}, {"tensor_parallel_size": 2}, "3 KV heads"),
        ({}, {}, {"pipeline_parallel_size": 3}, "2 layers cannot fill"),
        ({}, {}, {"pipeline_parallel_size": 2, "pipeline_stages": (2, 1)}, "pipeline_stages"),
        ({}, {"kv_tiers": {"dram_bytes": 1 << 20}}, {"pipeline_parallel_size": 2}, "KV tiers"),
        ({"architecture": "Gemma3ForCausalLM"}, {}, {"tensor_parallel_size": 2}, "not built yet for Gemma3"),
        (
            {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 16]}},
            {},
            {"tensor_parallel_size": 2},
            "quantized weights with tensor/pipeline parallelism are not built yet",
        ),
    ],
)
def test_what_a_group_cannot_run_is_refused(model, engine, parallel, message):
    with pytest.raises(RequestError, match=message):
        ParallelConfig(**parallel).validate(config(**model), EngineConfig(model="x", **engine))


def test_the_engine_refuses_before_starting_ranks(llama_dir):
    with pytest.raises(RequestError, match="KV tiers"):
        LLM(str(llama_dir), pipeline_parallel_size=2, kv_tiers={"dram_bytes": 1 << 20})


def test_stages_split_layers_evenly_unless_told():
    assert ParallelConfig(pipeline_parallel_size=3).stage_layers(8) == [(0, 3), (3, 6), (6, 8)]
    assert ParallelConfig(pipeline_parallel_size=2, pipeline_stages=(1, 7)).stage_layers(8) == [(0, 1), (1, 8)]


def test_micro_batches_are_contiguous_and_balanced():
    def item(n, decode=False):
        seq = Sequence(str(n), list(range(n)), SamplingParams())
        return ScheduledSeq(seq, 1 if decode else n)

    prefills = [item(8), item(2), item(6)]
    decodes = [item(3, True), item(4, True)]
    batch = SchedulerOutput(prefills, decodes, [])
    parts = split_batch(batch, 2)
    assert len(parts) == 2
    assert [s for p in parts for s in p.all] == batch.all  # the batch's order kept
    assert split_batch(batch, 1) == [batch]
    assert len(split_batch(SchedulerOutput([item(5)], [], []), 4)) == 1
    assert len(split_batch(batch, 10)) == 5
