"""Tensor and pipeline parallel groups (gloo on CPU) give transformers' greedy tokens and
logprobs, with prefix-cache hits and preemption, each rank holding about its share of weights."""

import json

import pytest
import torch
from safetensors import safe_open

from tests.engine.test_parity import MAX_TOKENS, PROMPTS, reference
from workers.engine import LLM, SamplingParams
from workers.engine.parallel.config import ParallelConfig
from workers.protocol.model_files import weight_files


def checkpoint_bytes(model_dir) -> int:
    total = 0
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118
                s = f.get_slice(name)
                total += torch.Size(s.get_shape()).numel() * 4  # fp32 checkpoints
    return total


def assert_matches(model_dir, prompt, comp):
    ref_tokens, ref_logprobs = reference(str(model_dir), prompt)
    assert comp.token_ids == ref_tokens
    mine = [comp.logprobs[i][t] for i, t in enumerate(comp.token_ids)]
    assert max(abs(a - b) for a, b in zip(mine, ref_logprobs, strict=True)) < 1e-3


def generate_tight(model_dir, tp: int, pp: int, params: SamplingParams):
    """PROMPTS on a tp x pp group whose 20 blocks of 4 tokens cannot hold the three sequences at
    once (someone is preempted, asserted), then PROMPTS[2] again (a prefix hit): the first
    outputs, the second, and the group's rank memory and KV layout."""
    with LLM(
        str(model_dir),
        dtype="float32",
        block_size=4,
        num_kv_blocks=20,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
    ) as llm:
        first = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
        assert llm.engine.scheduler.num_preemptions > 0
        again = llm.generate({"prompt_token_ids": PROMPTS[2]}, params)[0]
        return first, again, llm.engine.rank_memory(), llm.engine.kv_layout()


@pytest.mark.parametrize(
    ("arch", "overrides", "tp", "pp"),
    [
        ("llama", {}, 2, 1),
        ("llama", {}, 1, 2),
        ("llama", {}, 2, 2),
        ("llama_tied", {}, 2, 1),
        ("qwen2", {"num_key_value_heads": 1}, 2, 1),  # fewer KV heads than ranks: replicated
        ("qwen3", {}, 2, 1),
    ],
)
def test_parallel_group_matches_transformers(checkpoint_factory, arch, overrides, tp, pp):
    model_dir = checkpoint_factory(arch, **overrides)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=1, ignore_eos=True)
    first, again, memory, layout = generate_tight(model_dir, tp, pp, params)
    assert again.num_cached_tokens >= 40  # the prompt's full blocks, from the prefix cache
    # Each rank holds a shard of the cache: the layout a peer sees is rank 0's, placed in the
    # group, so a decode group of another shape cannot pair with it (kvtransfer/ranks.py).
    for prompt, out in zip(PROMPTS, first, strict=True):
        assert_matches(model_dir, prompt, out.outputs[0])
    assert_matches(model_dir, PROMPTS[2], again.outputs[0])

    assert layout | {"tp_rank": 0, "tp_size": tp, "pp_rank": 0, "pp_size": pp} == layout
    num_layers = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    start, end = ParallelConfig(tp, pp).stage_layers(num_layers)[0]
    assert layout["num_layers"] == end - start  # rank 0 holds its stage's layers only
    assert [m["rank"] for m in memory] == list(range(tp * pp))
    share = checkpoint_bytes(model_dir) / (tp * pp)
    for m in memory:
        assert 0.8 * share < m["weights"] < 1.25 * share, (m, share)
        assert m["kv_cache"] > 0
