"""Engine hooks for prefill/decode disaggregation: a prefill engine holds a finished prompt's
blocks, a decode engine reserves blocks, receives their bytes and decodes on. (The bytes are
copied with torch here; tests/integration/test_pd.py moves them with Mooncake between processes.)"""

import dataclasses

import pytest

from workers.engine import LLM, SamplingParams
from workers.engine.config import EngineConfig
from workers.engine.llm_engine import LLMEngine

PROMPTS = [list(range(20, 45)), [5, 9, 33, 100, 7, 8, 9, 10, 11, 12, 13, 14], [*range(20, 40), 7, 7]]
MAX_TOKENS = 12


def engine(model_dir, blocks: int) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", block_size=4, num_kv_blocks=blocks))


def run_to_end(eng: LLMEngine, rid: str) -> list:
    deltas = []
    while eng.has_unfinished_requests():
        deltas += [d for d in eng.step() if d.request_id == rid]
    return deltas


def handoff(prefill: LLMEngine, decode: LLMEngine, rid: str, prompt: list[int], params: SamplingParams):
    first_params = dataclasses.replace(params, max_tokens=1, n=1)  # as the prefill replica runs it
    prefill.add_request(rid, prompt, first_params, hold_blocks=True)
    (first,) = run_to_end(prefill, rid)
    assert first.finished and rid in prefill.held
    need = prefill.block_manager.blocks_needed(len(prompt))
    src = prefill.held[rid].block_table[:need]
    dst = decode.reserve_blocks(len(prompt))
    assert len(dst) == need
    decode.runner.kv_cache[:, :, dst] = prefill.runner.kv_cache[:, :, src]  # what the transfer does
    prefill.release_held(rid)
    lp = first.new_logprobs[0] if first.new_logprobs else None
    head = decode.add_prefilled_request(rid, prompt, params, dst, first.new_token_ids[0], lp, first.num_cached_tokens)
    return [head, *run_to_end(decode, rid)], first


def test_prefilled_request_decodes_exactly_like_a_colocated_one(model_dir):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=1)
    expected = LLM(str(model_dir), dtype="float32", block_size=4).generate(
        [{"prompt_token_ids": p} for p in PROMPTS], params
    )
    prefill, decode = engine(model_dir, 64), engine(model_dir, 48)  # different cache sizes on purpose
    for i, (prompt, want) in enumerate(zip(PROMPTS, expected, strict=True)):
        deltas, first = handoff(prefill, decode, f"r{i}", prompt, params)
        tokens = [t for d in deltas for t in d.new_token_ids]
        assert tokens == want.outputs[0].token_ids
        logprobs = [lp for d in deltas for lp in d.new_logprobs]
        for got, ref, t in zip(logprobs, want.outputs[0].logprobs, tokens, strict=True):
            assert got[t] == pytest.approx(ref[t], abs=1e-4)
        assert deltas[-1].finished and deltas[-1].num_output_tokens == MAX_TOKENS
    # The third prompt shares the first's leading blocks: the prefill side served them from cache.
    assert first.num_cached_tokens == 20
    assert decode.block_manager.num_free_blocks == 48  # every block came back...
    assert not prefill.held and prefill.block_manager.num_free_blocks == 64  # ...on both sides


def test_reserved_blocks_can_be_given_back_and_a_full_cache_says_so(model_dir):
    decode = engine(model_dir, 4)
    assert decode.reserve_blocks(17) is None  # 5 blocks of 4 tokens needed, 4 exist
    blocks = decode.reserve_blocks(16)
    assert len(blocks) == 4 and decode.block_manager.num_free_blocks == 0
    decode.release_blocks(blocks)
    assert decode.block_manager.num_free_blocks == 4


def test_aborting_a_held_request_frees_its_blocks(model_dir):
    prefill = engine(model_dir, 16)
    prefill.add_request("x", list(range(10)), SamplingParams(max_tokens=1), hold_blocks=True)
    run_to_end(prefill, "x")
    assert prefill.block_manager.num_free_blocks == 16 - 3
    prefill.abort_request("x")
    assert prefill.block_manager.num_free_blocks == 16 and not prefill.held


def test_kv_layout_names_what_must_match(model_dir):
    layout = engine(model_dir, 8).kv_layout()
    assert layout["block_size"] == 4 and layout["num_blocks"] == 8 and layout["dtype"] == "float32"
    assert {"architecture", "num_layers", "num_kv_heads", "head_dim", "tp_rank", "tp_size"} <= set(layout)
