"""Speculative decoding with the n-gram drafter changes no output: greedy tokens and logprobs
equal the plain engine's on every supported family, alone and in mixed batches, under
preemption, with prefix-cache hits, with stops inside an accepted run; seeded sampling gives
the same tokens; rejected drafts leave the KV cache and the block manager as if never drafted."""

from __future__ import annotations

import pytest
import torch

from tests.engine.test_disaggregation import handoff
from workers.engine import LLM, RequestError, SamplingParams
from workers.engine.block_manager import chain_hash
from workers.engine.config import EngineConfig
from workers.engine.llm_engine import LLMEngine
from workers.engine.sequence import Sequence
from workers.engine.speculative import DraftBackoff

ARCHS = ["llama", "mistral", "qwen2", "qwen3"]
# draft_backoff 0: a random model rejects most guesses, and these tests want every step to draft
# and roll back (test_backoff_pauses_a_sequence_whose_drafts_fail covers the default).
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 4,
    "draft_backoff": 0,
}
WIDE = {"disable_by_batch_size": 8}  # speculate with all of PROMPTS running
# Repetitive prompts, so that prompt lookup finds something; and ones where it does not.
PROMPTS = [
    [5, 9, 33, 100, 7, 8, 9, 10, 11] * 3,
    [3, 4],
    list(range(20, 70)) * 2,
    [7] * 10,
    [40, 41, 42, 43, 44, 45, 46, 40, 41, 42],
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=48, logprobs=2, ignore_eos=True)


def make(model_dir, speculative: bool, **kwargs) -> LLM:
    kwargs.setdefault("block_size", 4)
    spec = {**NGRAM, **kwargs.pop("spec", {})} if speculative else None
    return LLM(str(model_dir), device="cpu", dtype="float32", speculative_config=spec, **kwargs)


def generate(llm: LLM, prompts, params):
    return [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]


def assert_same(got, want, tol: float = 1e-4) -> None:
    """Same tokens, text and finish; logprobs (every entry of every token) within `tol`."""
    assert got.token_ids == want.token_ids
    assert (got.text, got.finish_reason, got.stop_reason) == (want.text, want.finish_reason, want.stop_reason)
    if want.logprobs is not None:
        assert len(got.logprobs) == len(want.logprobs)
        for mine, ref in zip(got.logprobs, want.logprobs, strict=True):
            assert mine.keys() == ref.keys()
            assert max(abs(mine[t] - ref[t]) for t in ref) < tol


class BatchLog:
    """Wraps a runner to record, per step, each sampling sequence's drafts (and check caps)."""

    def __init__(self, engine: LLMEngine):
        self.steps: list[list[tuple[str, list[int]]]] = []
        execute = engine.runner.execute

        def recording(batch, *args, **kwargs):
            logits, sampling = execute(batch, *args, **kwargs)
            for item in sampling:
                seq, drafts = item.seq, item.draft_token_ids
                # Never more guesses than could be emitted within max_tokens and the context.
                assert seq.params.max_tokens is None or len(drafts) + seq.num_output_tokens < seq.params.max_tokens
                assert seq.num_tokens + len(drafts) < engine.max_model_len
            self.steps.append([(item.seq.request_id, list(item.draft_token_ids)) for item in sampling])
            return logits, sampling

        engine.runner.execute = recording

    @property
    def mixed_steps(self) -> int:
        """Steps where some sequences verified drafts and others sampled plainly."""
        return sum(1 for s in self.steps if any(d for _, d in s) and not all(d for _, d in s))


def assert_consistent(engine: LLMEngine, kv_mirror: set[int] | None = None) -> None:
    """The block manager's books balance: ref counts equal the block tables holding each
    block, the free lists hold exactly the unreferenced blocks, every hash names the block
    holding its tokens, every sequence's hashed blocks hold its own (accepted) tokens, block
    tables cover exactly the computed tokens, and the KV events replayed give the cache."""
    bm = engine.block_manager
    holders = [s for s in engine.scheduler.running] + list(engine.held.values())
    refs = [0] * bm.num_blocks
    for seq in holders:
        for bid in seq.block_table:
            refs[bid] += 1
    assert [b.ref_count for b in bm.blocks] == refs
    free_uncached, free_cached = set(bm.free_uncached), set(bm.free_cached)
    assert len(free_uncached) == len(bm.free_uncached) and not free_uncached & free_cached
    assert free_uncached | free_cached == {b.block_id for b in bm.blocks if b.ref_count == 0}
    for bid in free_uncached:
        assert bm.blocks[bid].hash is None
    for bid in free_cached:
        assert bm.hash_to_block[bm.blocks[bid].hash] == bid
    for h, bid in bm.hash_to_block.items():
        assert bm.blocks[bid].hash == h and len(bm.blocks[bid].token_ids) == bm.block_size
    bs = bm.block_size
    for seq in engine.scheduler.running:
        assert len(seq.block_table) == bm.blocks_needed(seq.num_computed_tokens) or (
            seq.num_computed_tokens == 0 and not seq.block_table
        )
        assert len(seq.block_hashes) == seq.num_computed_tokens // bs
        prev = None
        for i, h in enumerate(seq.block_hashes):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            assert h == chain_hash(prev, tokens)
            block = bm.blocks[seq.block_table[i]]
            assert block.hash == h and block.token_ids == tokens
            prev = h
        for bid in seq.block_table[len(seq.block_hashes) :]:  # the partial block is unhashed
            assert bm.blocks[bid].hash is None
    if kv_mirror is not None:
        stored, removed = bm.take_kv_events()
        kv_mirror.difference_update(removed)
        kv_mirror.update(stored)
        assert kv_mirror == set(bm.hash_to_block)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_is_lossless_alone_and_in_mixed_batches(checkpoint_factory, arch):
    model_dir = checkpoint_factory(arch)
    base, spec = make(model_dir, False), make(model_dir, True)
    log = BatchLog(spec.engine)
    want = [generate(base, [p], GREEDY)[0] for p in PROMPTS]
    for p, w in zip(PROMPTS, want, strict=True):  # alone
        assert_same(generate(spec, [p], GREEDY)[0], w)
    # Together, with different lengths and limits: sequences with and without drafts share steps.
    params = [SamplingParams(temperature=0.0, max_tokens=m, logprobs=1, ignore_eos=True) for m in (48, 9, 30, 48, 17)]
    together = generate(spec, PROMPTS, params)
    for got, w, p in zip(together, want, params, strict=True):
        assert got.token_ids == w.token_ids[: p.max_tokens]
        for mine, ref, t in zip(got.logprobs, w.logprobs[: p.max_tokens], got.token_ids, strict=True):
            assert abs(mine[t] - ref[t]) < 1e-4
    stats = spec.engine.speculation_stats()
    assert stats["num_accepted_tokens"] > 0, "the test must exercise accepted drafts"
    assert stats["num_accepted_tokens"] < stats["num_draft_tokens"], "... and rejected ones"
    assert log.mixed_steps > 0
    assert stats["mean_acceptance_length"] == 1 + stats["num_accepted_tokens"] / stats["num_drafts"]
    assert spec.engine.block_manager.num_free_blocks == spec.engine.block_manager.num_blocks


def test_greedy_is_lossless_under_preemption_and_chunked_prefill(checkpoint_factory):
    model_dir = checkpoint_factory("qwen3")
    want = [generate(make(model_dir, False), [p], GREEDY)[0] for p in PROMPTS]
    # 40 blocks of 4 cannot hold five requests at full length; 16 tokens a step chunk the prefill.
    tight = make(model_dir, True, num_kv_blocks=40, max_num_batched_tokens=16, spec=WIDE)
    engine = tight.engine
    log = BatchLog(engine)
    mirror: set[int] = set()
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), p, GREEDY)
    got: dict[str, list] = {str(i): [] for i in range(len(PROMPTS))}
    while engine.has_unfinished_requests():
        for d in engine.step():
            got[d.request_id].append(d)
        assert_consistent(engine, mirror)
    assert engine.scheduler.num_preemptions > 0
    assert engine.speculation_stats()["num_accepted_tokens"] > 0 and log.mixed_steps > 0
    for i, w in enumerate(want):
        assert [t for d in got[str(i)] for t in d.new_token_ids] == w.token_ids
        lps = [lp for d in got[str(i)] for lp in d.new_logprobs]
        assert max(abs(lp[t] - r[t]) for lp, r, t in zip(lps, w.logprobs, w.token_ids, strict=True)) < 1e-4
    assert engine.block_manager.num_free_blocks == 40


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_prefix_cache_holds_only_accepted_tokens_kv(checkpoint_factory, arch):
    """Every block the speculative engine's prefix cache serves holds the K/V the plain engine
    computes for the same tokens (a rejected draft's K/V in a hashed block would differ), and
    a second round served from that cache still gives the plain engine's output."""
    model_dir = checkpoint_factory(arch)
    base, spec = make(model_dir, False), make(model_dir, True, spec=WIDE)
    want = generate(base, PROMPTS, GREEDY)
    first = generate(spec, PROMPTS, GREEDY)
    # Prompt + output as a new prompt: its blocks, output ones included, come from the cache.
    followups = [p + w.token_ids[:40] for p, w in zip(PROMPTS, want, strict=True)]
    want2 = generate(base, followups, GREEDY)
    again = spec.generate([{"prompt_token_ids": p} for p in followups], GREEDY)
    for got, w in zip(first, want, strict=True):
        assert_same(got, w)
    for got, w, p in zip(again, want2, followups, strict=True):
        assert_same(got.outputs[0], w)
        assert got.num_cached_tokens >= (len(p) - 1) // 4 * 4 - 4
    assert spec.engine.speculation_stats()["num_accepted_tokens"] > 0
    bm, ref = spec.engine.block_manager, base.engine.block_manager
    common = set(bm.hash_to_block) & set(ref.hash_to_block)
    assert len(common) > 50
    kv, kv_ref = spec.engine.runner.kv_cache, base.engine.runner.kv_cache
    for h in common:
        a, b = kv[:, :, bm.hash_to_block[h]], kv_ref[:, :, ref.hash_to_block[h]]
        assert torch.allclose(a, b, atol=1e-4), "a cached block holds K/V the plain engine does not compute"
    assert_consistent(spec.engine)


def steps_with_runs(model_dir, prompt, params, eos: tuple[int, ...] | None = None):
    """Run one request on a speculative engine step by step: [(delta, verified tokens)]."""
    engine = make(model_dir, True).engine
    if eos is not None:
        engine.eos_token_ids = eos
    verified: list[list[int]] = []
    verify = engine.sampler.verify

    def recording(logits, seqs, drafts, draft_probs=None):
        results = verify(logits, seqs, drafts, draft_probs)
        verified.extend(r.token_ids for r in results)
        return results

    engine.sampler.verify = recording
    engine.add_request("r", prompt, params)
    out = []
    while engine.has_unfinished_requests():
        for d in engine.step():
            tokens = verified.pop() if verified else None
            out.append((d, tokens))
    return engine, out


def find_run(model_dir, prompts=PROMPTS, fits=lambda before, run: len(run) >= 3):
    """(prompt, output before the run, the run): the first step of a greedy speculative run
    that emitted more than one token (accepted drafts and the target's own) and `fits`
    (by default: at least 3 tokens)."""
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    for prompt in prompts:
        _, steps = steps_with_runs(model_dir, prompt, params)
        output: list[int] = []
        for delta, _ in steps:
            if len(delta.new_token_ids) > 1 and fits(output, delta.new_token_ids):
                return prompt, output, delta.new_token_ids
            output += delta.new_token_ids
    raise AssertionError("no accepted run that fits")


def test_stop_string_ending_inside_an_accepted_run(checkpoint_factory):
    model_dir = checkpoint_factory("qwen3")
    prompt, before, run = find_run(model_dir)
    tokenizer = make(model_dir, False).tokenizer
    # A stop string ending in the text of a token inside the run (not its last), nowhere earlier.
    stop = None
    for j in range(len(run) - 1):
        text = tokenizer.decode(before + run[: j + 1])
        if len(text) > len(tokenizer.decode(before + run[:j])):
            tail = text[-3:]
            if text.find(tail) == len(text) - len(tail):
                stop, end = tail, len(before) + j + 1
                break
    assert stop is not None
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, stop=[stop], logprobs=0)
    want = generate(make(model_dir, False), [prompt], params)[0]
    assert want.finish_reason == "stop" and want.stop_reason == stop and len(want.token_ids) == end
    _, steps = steps_with_runs(model_dir, prompt, params)
    assert [t for d, _ in steps for t in d.new_token_ids] == want.token_ids
    assert "".join(d.new_text for d, _ in steps) == want.text
    last, verified = steps[-1]
    assert (last.finished, last.finish_reason, last.stop_reason) == (True, "stop", stop)
    # The stop came inside a verified run: the tokens accepted after it were dropped.
    assert verified is not None and len(verified) > len(last.new_token_ids)
    assert_same(generate(make(model_dir, True), [prompt], params)[0], want)


def test_eos_and_stop_token_inside_an_accepted_run(checkpoint_factory):
    """An EOS (or stop token) that is an accepted draft ends the output there; what the step
    emitted after it is dropped."""
    model_dir = checkpoint_factory("qwen3")

    # An accepted draft that the output has not produced before. Drafts copy from the prompt
    # and the output, and a random model does not copy its prompt; but given its own earlier
    # output (which falls into loops) as the prompt, it goes on copying it.
    def new_token(before, run):
        return next((i for i in range(len(run) - 1) if run[i] not in before + run[:i]), None)

    outputs = generate(make(model_dir, False), PROMPTS, GREEDY)
    prompts = [p + out.token_ids[:40] for p, out in zip(PROMPTS, outputs, strict=True)]
    prompt, before, run = find_run(model_dir, prompts, lambda before, run: new_token(before, run) is not None)
    output = before + run
    index = len(before) + new_token(before, run)
    token = output[index]
    for kind in ("eos", "stop_token"):
        params = SamplingParams(
            temperature=0.0, max_tokens=64, logprobs=1, stop_token_ids=[token] if kind == "stop_token" else []
        )
        eos = (token,) if kind == "eos" else None
        base = make(model_dir, False)
        if eos:
            base.engine.eos_token_ids = eos
        want = generate(base, [prompt], params)[0]
        assert want.token_ids == output[: index + 1] and want.finish_reason == "stop"
        _, steps = steps_with_runs(model_dir, prompt, params, eos)
        assert [t for d, _ in steps for t in d.new_token_ids] == want.token_ids
        assert [lp for d, _ in steps for lp in d.new_logprobs][-1][token] == pytest.approx(want.logprobs[-1][token])
        last, verified = steps[-1]
        assert last.finish_reason == "stop" and last.stop_reason == (token if kind == "stop_token" else None)
        assert verified is not None and len(verified) > len(last.new_token_ids)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 4, 5, 7])
def test_max_tokens_is_never_exceeded(checkpoint_factory, max_tokens):
    model_dir = checkpoint_factory("qwen3")
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=0, ignore_eos=True)
    spec = make(model_dir, True)
    BatchLog(spec.engine)  # asserts the drafts' caps at every step
    prompts = [[7] * 10, PROMPTS[0]]
    for got, want in zip(
        generate(spec, prompts, params), generate(make(model_dir, False), prompts, params), strict=True
    ):
        assert len(got.token_ids) == max_tokens
        assert_same(got, want)


def test_context_end_is_never_exceeded(checkpoint_factory):
    model_dir = checkpoint_factory("qwen3")
    params = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
    prompt = [7] * 10
    spec, base = make(model_dir, True, max_model_len=40), make(model_dir, False, max_model_len=40)
    BatchLog(spec.engine)
    got, want = generate(spec, [prompt], params)[0], generate(base, [prompt], params)[0]
    assert got.token_ids == want.token_ids and len(prompt) + len(got.token_ids) == 40
    assert got.finish_reason == "length"
    assert spec.engine.speculation_stats()["num_accepted_tokens"] > 0


SAMPLED = {
    "plain": dict(temperature=0.8),
    "filters": dict(temperature=1.2, top_k=20, top_p=0.9, min_p=0.02),
    "penalties": dict(temperature=0.3, repetition_penalty=1.1, frequency_penalty=0.1, presence_penalty=0.1),
}


@pytest.mark.parametrize("kind", SAMPLED)
def test_seeded_sampling_gives_the_same_tokens_as_without_speculation(checkpoint_factory, kind):
    """Each draft position draws with the noise the sampler would use for that output position
    (and its penalties count the drafts before it), so a one-hot draft (n-gram) is accepted
    exactly when the plain engine would have sampled it."""
    model_dir = checkpoint_factory("qwen3")
    params = [
        SamplingParams(seed=seed, max_tokens=40, logprobs=1, ignore_eos=True, **SAMPLED[kind]) for seed in (1, 2, 3)
    ]
    prompts = [PROMPTS[0], [7] * 10, PROMPTS[4]]
    want = generate(make(model_dir, False), prompts, params)
    spec = make(model_dir, True)
    got = generate(spec, prompts, params)
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
    assert spec.engine.speculation_stats()["num_accepted_tokens"] > 0


def test_unseeded_sampling_is_reproducible_run_to_run(checkpoint_factory):
    model_dir = checkpoint_factory("qwen3")
    params = SamplingParams(temperature=0.8, max_tokens=40, ignore_eos=True)
    runs = [[o.token_ids for o in generate(make(model_dir, True, seed=5), PROMPTS, params)] for _ in range(2)]
    assert runs[0] == runs[1]


def test_abort_mid_run_releases_everything(checkpoint_factory):
    model_dir = checkpoint_factory("qwen3")
    engine = make(model_dir, True, num_kv_blocks=64, spec=WIDE).engine
    mirror: set[int] = set()
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), p, GREEDY)
    for step in range(12):
        engine.step()
        if step == 6:
            assert engine.abort_request("0") and engine.abort_request("3")
        assert_consistent(engine, mirror)
    assert engine.speculation_stats()["num_accepted_tokens"] > 0
    for i in range(len(PROMPTS)):
        engine.abort_request(str(i))
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == 64
    assert_consistent(engine, mirror)


def test_kv_rollback_keeps_the_block_manager_consistent_over_many_rounds(checkpoint_factory):
    """Many requests with prefix sharing, sampling (so drafts are rejected often) and greedy
    (long accepted runs), a cache tight enough to evict and preempt: the books balance after
    every step, and at the end every block is free again."""
    model_dir = checkpoint_factory("qwen3")
    engine = make(model_dir, True, num_kv_blocks=48, max_num_batched_tokens=32, spec=WIDE).engine
    mirror: set[int] = set()
    rng = torch.Generator().manual_seed(0)
    shared = [11, 12, 13, 14, 15, 16, 17, 18]
    for i in range(24):
        tail = torch.randint(20, 60, (int(torch.randint(1, 12, (1,), generator=rng)),), generator=rng).tolist()
        prompt = shared + tail + tail if i % 2 else tail * 3
        temperature = 0.0 if i % 3 else 0.9
        params = SamplingParams(temperature=temperature, seed=i, max_tokens=int(8 + i % 20), ignore_eos=True)
        engine.add_request(str(i), prompt, params)
        engine.step()
        assert_consistent(engine, mirror)
    while engine.has_unfinished_requests():
        engine.step()
        assert_consistent(engine, mirror)
    stats = engine.speculation_stats()
    assert stats["num_verify_steps"] > 20
    assert 0 < stats["num_accepted_tokens"] < stats["num_draft_tokens"]
    assert engine.scheduler.num_preemptions > 0
    assert engine.block_manager.hits > 0
    assert engine.block_manager.num_free_blocks == 48


def test_speculation_switches_off_above_the_batch_threshold(checkpoint_factory):
    model_dir = checkpoint_factory("qwen3")
    spec = make(model_dir, True, spec={"disable_by_batch_size": 2})
    engine = spec.engine
    log = BatchLog(engine)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (40, 12, 12)]
    got = generate(spec, [[7] * 10, [7] * 10 + [8], [7] * 10 + [9]], params)
    want = generate(make(model_dir, False), [[7] * 10, [7] * 10 + [8], [7] * 10 + [9]], params)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    for step in log.steps:
        if len(step) > 2:  # three running: no drafts
            assert not any(d for _, d in step)
    assert any(d for step in log.steps for _, d in step)  # ... but once one finished, drafts again


def test_backoff_pauses_a_sequence_whose_drafts_fail(checkpoint_factory):
    """With the default backoff, a sequence whose guesses keep being rejected (a random model
    never continues its prompt the way prompt lookup guesses) drafts on far fewer steps, and its
    tokens and logprobs are unchanged."""
    model_dir = checkpoint_factory("llama")
    prompts = [[7] * 10, [5, 9, 33, 100, 7, 8, 9, 10, 11] * 3, [9, 8] * 6]  # lookup always has a guess
    params = SamplingParams(temperature=0.0, max_tokens=96, logprobs=2, ignore_eos=True)
    want = generate(make(model_dir, False), prompts, params)
    runs = {}
    for backoff in (0, 2):
        llm = make(model_dir, True, spec={**WIDE, "draft_backoff": backoff})
        for got, w in zip(generate(llm, prompts, params), want, strict=True):
            assert_same(got, w)
        runs[backoff] = llm.engine.speculation_stats()
    every, paused = runs[0], runs[2]
    assert every["num_accepted_tokens"] < every["num_drafts"] / 2, "the guesses are mostly rejected"
    assert paused["num_drafts"] < every["num_drafts"] / 2, (paused, every)
    assert paused["num_drafts"] > 0  # a paused sequence tries again


def test_backoff_doubles_the_pause_and_an_accepted_token_resets_it():
    seq = Sequence("r", [1, 2, 3], SamplingParams())
    backoff = DraftBackoff(after=2)

    def skipped_after_a_miss() -> int:
        backoff.record(seq, accepted=0)
        steps = 0
        while not backoff.allows(seq):
            steps += 1
        return steps

    assert [skipped_after_a_miss() for _ in range(8)] == [0, 1, 2, 4, 8, 16, 16, 16]
    backoff.record(seq, accepted=1)
    assert [skipped_after_a_miss() for _ in range(3)] == [0, 1, 2]
    never = DraftBackoff(after=0)
    for _ in range(5):
        never.record(seq, accepted=0)
    assert never.allows(seq) and seq.draft_misses == 0


def test_decode_role_of_a_disaggregated_deployment(checkpoint_factory):
    """A prompt prefilled elsewhere decodes with speculation exactly as a colocated one."""
    model_dir = checkpoint_factory("qwen3")
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=1)
    prompt = PROMPTS[0]
    want = generate(make(model_dir, False), [prompt], params)[0]
    prefill = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", block_size=4, num_kv_blocks=64))
    decode = LLMEngine(
        EngineConfig(model=str(model_dir), dtype="float32", block_size=4, num_kv_blocks=48, speculative_config=NGRAM)
    )
    deltas, _ = handoff(prefill, decode, "r", prompt, params)
    assert [t for d in deltas for t in d.new_token_ids] == want.token_ids
    assert decode.speculation_stats()["num_accepted_tokens"] > 0
    assert decode.block_manager.num_free_blocks == 48


def test_stats_and_configuration(checkpoint_factory, llama_dir):
    assert make(llama_dir, False).engine.speculation_stats() is None
    stats = make(llama_dir, True).engine.speculation_stats()
    assert stats["drafted_per_position"] == [0, 0, 0] and stats["mean_acceptance_length"] is None
    with pytest.raises(RequestError, match="'eagle3' needs 'model'"):
        LLM(str(llama_dir), speculative_config={"method": "eagle3", "num_speculative_tokens": 3})
    with pytest.raises(RequestError, match="unknown speculative method 'medusa'"):
        LLM(str(llama_dir), speculative_config={"method": "medusa", "num_speculative_tokens": 3})
