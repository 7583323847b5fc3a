"""`n` samples of one prompt share its KV blocks (parallel_sampling.py); logit_bias in the sampler."""

import pytest

from workers.engine import LLM, SamplingParams
from workers.engine.errors import RequestError

PROMPT = list(range(10, 50))  # 40 tokens: 9 full blocks of 4 shared, the 10th computed by each sample


def _llm(llama_dir, **kwargs):
    kwargs.setdefault("block_size", 4)
    return LLM(str(llama_dir), device="cpu", dtype="float32", **kwargs)


def _tokens(out):
    return [c.token_ids for c in out.outputs]


def test_forked_samples_reference_the_prompt_blocks_and_free_them(llama_dir):
    llm = _llm(llama_dir, num_kv_blocks=64)
    engine, bm = llm.engine, llm.engine.block_manager
    engine.add_request("r", PROMPT, SamplingParams(n=4, temperature=0.0, max_tokens=6, ignore_eos=True))
    engine.step()  # prefills the prompt once and forks
    samples = engine.requests["r"].samples
    assert [s.index for s in samples] == [0, 1, 2, 3]
    shared = samples[0].block_table[:9]
    for child in samples[1:]:
        assert child.block_table == shared and child.num_computed_tokens == 36
    assert all(bm.blocks[b].ref_count == 4 for b in shared)
    while engine.has_unfinished_requests():
        deltas = engine.step()
        # Every sample owns its last prompt block and its output blocks.
        live = [s for s in samples if not s.is_finished]
        tails = [b for s in live for b in s.block_table[9:]]
        assert len(tails) == len(set(tails))
        assert all(d.request_id == "r" for d in deltas)
    assert bm.num_free_blocks == 64
    assert "r" not in engine.requests


def _count_computed(engine) -> list[int]:
    """Tokens the model computes per step, recorded from the runner's batches."""
    counts, execute = [], engine.runner.execute

    def counting(batch, *args, **kwargs):
        counts.append(sum(item.num_tokens for item in batch.all))
        return execute(batch, *args, **kwargs)

    engine.runner.execute = counting
    return counts


def test_prompt_tokens_are_computed_once_plus_each_samples_last_block(llama_dir):
    engine = _llm(llama_dir, num_kv_blocks=64, enable_prefix_caching=False).engine
    counts = _count_computed(engine)
    engine.add_request("r", PROMPT, SamplingParams(n=4, temperature=0.0, max_tokens=3, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    # 40 prompt tokens once, 4 for each of 3 forked samples, then 2 decode steps of 4 samples.
    assert sum(counts) == 40 + 3 * 4 + 2 * 4


def test_greedy_samples_all_equal_the_single_answer(llama_dir):
    llm = _llm(llama_dir)
    one = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    three = llm.generate(
        {"prompt_token_ids": PROMPT}, SamplingParams(n=3, temperature=0.0, max_tokens=12, ignore_eos=True)
    )[0]
    assert [c.index for c in three.outputs] == [0, 1, 2]
    assert _tokens(three) == [one[0].outputs[0].token_ids] * 3
    assert all(c.finish_reason == "length" for c in three.outputs)


def test_seeded_samples_reproduce_and_differ(llama_dir):
    params = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    first = _tokens(_llm(llama_dir).generate({"prompt_token_ids": PROMPT}, params)[0])
    again = _tokens(_llm(llama_dir, enable_prefix_caching=False).generate({"prompt_token_ids": PROMPT}, params)[0])
    assert first == again
    assert len({tuple(t) for t in first}) > 1
    # Sample i is the n=1 request seeded seed + i.
    alone = _llm(llama_dir).generate(
        {"prompt_token_ids": PROMPT}, SamplingParams(temperature=1.0, seed=9, max_tokens=10, ignore_eos=True)
    )
    assert first[2] == alone[0].outputs[0].token_ids


def test_preempted_samples_recompute_to_the_same_answers(llama_dir):
    params = SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=20, ignore_eos=True)
    roomy = _tokens(_llm(llama_dir).generate({"prompt_token_ids": PROMPT}, params)[0])
    others = [list(range(60, 60 + k)) for k in (30, 25)]
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    alone = [_llm(llama_dir).generate({"prompt_token_ids": p}, greedy)[0].outputs[0].token_ids for p in others]
    for caching in (True, False):
        tight = _llm(llama_dir, num_kv_blocks=40, max_num_batched_tokens=16, enable_prefix_caching=caching)
        outs = tight.generate(
            [{"prompt_token_ids": PROMPT}, *({"prompt_token_ids": p} for p in others)], [params, greedy, greedy]
        )
        assert tight.engine.scheduler.num_preemptions > 0
        assert _tokens(outs[0]) == roomy
        assert [o.outputs[0].token_ids for o in outs[1:]] == alone
        assert tight.engine.block_manager.num_free_blocks == 40


def test_abort_ends_every_sample(llama_dir):
    llm = _llm(llama_dir, num_kv_blocks=64)
    engine = llm.engine
    engine.add_request("r", PROMPT, SamplingParams(n=3, temperature=0.0, max_tokens=50, ignore_eos=True))
    engine.step()
    engine.step()
    samples = engine.requests["r"].samples
    assert len(samples) == 3
    assert engine.abort_request("r")
    assert all(s.finish_reason == "abort" for s in samples)
    assert not engine.has_unfinished_requests() and engine.block_manager.num_free_blocks == 64
    assert not engine.abort_request("r")


def test_a_finished_first_sample_keeps_the_request_until_all_finish(llama_dir):
    llm = _llm(llama_dir)
    out = llm.generate(
        {"prompt_token_ids": PROMPT}, SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=1, ignore_eos=True)
    )[0]
    assert out.finished and all(len(c.token_ids) == 1 for c in out.outputs)
    assert not llm.engine.requests


def test_logit_bias_forces_and_bans_tokens(llama_dir):
    llm = _llm(llama_dir)
    free = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    first = free[0].outputs[0].token_ids[0]
    forced = llm.generate(
        {"prompt_token_ids": PROMPT},
        SamplingParams(temperature=1.0, seed=0, max_tokens=8, ignore_eos=True, logit_bias={"77": 100}),
    )
    assert forced[0].outputs[0].token_ids == [77] * 8
    banned = llm.generate(
        {"prompt_token_ids": PROMPT},
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logit_bias={first: -100}),
    )
    assert first not in banned[0].outputs[0].token_ids


def test_logit_bias_leaves_other_rows_of_the_batch_alone(llama_dir):
    free = SamplingParams(temperature=1.0, seed=5, max_tokens=10, ignore_eos=True)
    llm = _llm(llama_dir)
    alone = llm.generate({"prompt_token_ids": PROMPT}, free)[0].outputs[0].token_ids
    biased = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logit_bias={3: 50, 4: -100})
    both = _llm(llama_dir).generate([{"prompt_token_ids": PROMPT}, {"prompt_token_ids": PROMPT[:20]}], [free, biased])
    assert both[0].outputs[0].token_ids == alone
    assert 4 not in both[1].outputs[0].token_ids


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"n": 2, "seed": 2**64 - 1}, "seed"),
        ({"logit_bias": {"a": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"5": float("nan")}}, "logit_bias"),
        ({"logit_bias": [1, 2]}, "logit_bias"),
    ],
)
def test_bad_n_and_logit_bias_are_refused_naming_the_parameter(kwargs, param):
    with pytest.raises(RequestError) as err:
        SamplingParams(**kwargs)
    assert err.value.param == param


def test_logit_bias_ids_past_the_vocabulary_are_refused(llama_dir):
    engine = _llm(llama_dir).engine
    with pytest.raises(RequestError, match="logit_bias"):
        engine.add_request("r", PROMPT, SamplingParams(logit_bias={10**6: 1}))
    assert not engine.has_unfinished_requests()


def test_n_where_forking_is_not_built_is_refused_naming_n(llama_dir):
    plain = _llm(llama_dir).engine
    for kwargs in ({"hold_blocks": True}, {"output_token_ids": [5]}):
        with pytest.raises(RequestError, match="not built yet") as err:
            plain.add_request("r", PROMPT, SamplingParams(n=2), **kwargs)
        assert err.value.param == "n"
    assert not plain.has_unfinished_requests()
