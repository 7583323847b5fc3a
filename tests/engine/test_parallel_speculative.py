"""Speculative decoding on a parallel group (gloo on CPU): n-gram and EAGLE-3 under tensor and
pipeline parallelism give the single-device engine's tokens, the head drafting on rank 0 from
the layer outputs every stage computed; a head that does not fit is refused before any rank
starts."""

import pytest
import torch

from tests.engine.checkpoints import build_eagle3_head
from tests.engine.test_speculative_decode import PROMPTS, assert_same, generate
from workers.engine import LLM, SamplingParams
from workers.engine.errors import ModelLoadError, RequestError

PARAMS = SamplingParams(temperature=0.0, max_tokens=48, logprobs=1, ignore_eos=True)
EVERY_STEP = {"disable_by_batch_size": 8, "draft_backoff": 0}  # draft (and roll back) at every step


def assert_close(got, want) -> None:
    """Same tokens; logprobs within the parallel group's rounding (its sums are all-reduced)."""
    for g, w in zip(got, want, strict=True):
        assert_same(g, w, tol=1e-3)


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)])
def test_ngram_on_a_parallel_group_gives_the_single_device_tokens(checkpoint_factory, tp, pp):
    model_dir = checkpoint_factory("llama")
    prompts = PROMPTS
    want = generate(LLM(str(model_dir), dtype="float32", block_size=4), prompts, PARAMS)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, **EVERY_STEP}
    with LLM(
        str(model_dir),
        dtype="float32",
        block_size=4,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        speculative_config=spec,
    ) as llm:
        got = generate(llm, prompts, PARAMS)
        stats = llm.engine.speculation_stats()
        free = llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks
    assert_close(got, want)
    assert 0 < stats["num_accepted_tokens"] < stats["num_draft_tokens"] and free


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2), (2, 2)])
def test_eagle3_on_a_parallel_group_drafts_as_on_one_device(checkpoint_factory, tmp_path, tp, pp):
    """The head on rank 0 reads the layer outputs of every stage (the residual stream is whole
    on each tensor-parallel rank; later stages send theirs to rank 0) and the whole embedding
    from the checkpoint: its drafts are the single-device engine's, and the tokens are the
    plain engine's."""
    model_dir = checkpoint_factory("llama", num_hidden_layers=4)  # aux layers 0, 1 | 3: on both stages
    head = build_eagle3_head(tmp_path / "head", model_dir, seed=6, random_norms=True)
    spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3, **EVERY_STEP}
    prompts = [PROMPTS[0], PROMPTS[2][:41]]
    want = generate(LLM(str(model_dir), dtype="float32", block_size=4), prompts, PARAMS)

    def first_drafts(llm: LLM) -> list[list[int]]:
        engine = llm.engine
        for i, p in enumerate(prompts):
            engine.add_request(f"d{i}", p, PARAMS)
        engine.step()  # the prefill: the head observes both prompts
        seqs = [engine.requests[f"d{i}"] for i in range(len(prompts))]
        drafts = engine.drafter.propose(seqs, [3, 3])
        for i in range(len(prompts)):
            engine.abort_request(f"d{i}")
        return drafts

    one = LLM(str(model_dir), dtype="float32", block_size=4, speculative_config=spec)
    with LLM(
        str(model_dir),
        dtype="float32",
        block_size=4,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        speculative_config=spec,
    ) as llm:
        drafts = first_drafts(llm)
        got = generate(llm, prompts, PARAMS)
        stats = llm.engine.speculation_stats()
    assert drafts == first_drafts(one) and all(len(d) == 3 for d in drafts)
    assert_close(got, want)
    assert stats["num_drafts"] > 10


def test_a_head_that_does_not_fit_is_refused_before_any_rank_starts(checkpoint_factory, tmp_path):
    model_dir, other = checkpoint_factory("llama"), checkpoint_factory("llama", hidden_size=96)
    head = build_eagle3_head(tmp_path / "head", other)
    spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3}
    with pytest.raises(ModelLoadError, match="does not fit target"):
        LLM(str(model_dir), dtype="float32", pipeline_parallel_size=2, speculative_config=spec)
    with LLM(str(model_dir), dtype="float32", tensor_parallel_size=2) as llm:  # no group was left behind
        assert llm.generate({"prompt_token_ids": [3, 4]}, SamplingParams(max_tokens=2))[0].outputs[0].token_ids


@pytest.mark.parametrize("aux_layer_ids", [[5, 1, 3], [0, 0, 4]])
def test_the_heads_states_reach_rank_0_in_its_order(checkpoint_factory, tmp_path, aux_layer_ids):
    """Over three stages, in chunked prefills of several micro-batches, with the head's layers
    named out of order or twice (a stage may hold none): after every step rank 0 holds the
    single-device engine's aux states."""
    model_dir = checkpoint_factory("llama", num_hidden_layers=6)  # stages hold layers 0-1, 2-3, 4-5
    head = build_eagle3_head(tmp_path / "head", model_dir, aux_layer_ids=aux_layer_ids, random_norms=True)
    spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3, **EVERY_STEP}
    common = {"dtype": "float32", "block_size": 4, "max_num_batched_tokens": 16, "speculative_config": spec}
    one = LLM(str(model_dir), **common).engine
    with LLM(str(model_dir), pipeline_parallel_size=3, **common) as llm:
        group = llm.engine
        for engine in (one, group):
            for i, p in enumerate(PROMPTS[:3]):
                engine.add_request(str(i), p[:30], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
        steps = 0
        while one.has_unfinished_requests():
            want, got = one.step(), group.step()
            assert [d.new_token_ids for d in got] == [d.new_token_ids for d in want]
            mine, theirs = group.runner.aux_hidden_states, one.runner.aux_hidden_states
            assert mine.shape == theirs.shape == (theirs.shape[0], 3 * 64)
            assert torch.allclose(mine, theirs, atol=1e-4), steps
            steps += 1
    assert steps > 8


def test_an_engine_that_fails_after_its_ranks_started_leaves_none_running(checkpoint_factory):
    import multiprocessing

    model_dir = checkpoint_factory("llama")
    with pytest.raises(RequestError, match="KV cache budget is too small"):
        LLM(str(model_dir), dtype="float32", tensor_parallel_size=2, kv_cache_bytes=1)
    assert not multiprocessing.active_children()
    with LLM(str(model_dir), dtype="float32", tensor_parallel_size=2) as llm:  # a group can start again
        assert llm.generate({"prompt_token_ids": [3, 4]}, SamplingParams(max_tokens=2))[0].outputs[0].token_ids
