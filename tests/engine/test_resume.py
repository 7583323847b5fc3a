"""A request resumed on another engine after N tokens (its replica died) continues exactly as the
undisturbed run: the same tokens, logprobs and text, max_tokens and usage counted over the whole
generation, penalties over the whole output, seeded draws by output position, and a stop string
that spans the seam still found."""

from __future__ import annotations

import pytest
import torch

from workers.engine import LLM, SamplingParams
from workers.engine.sampler import Sampler, position_seed
from workers.engine.sequence import Sequence

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def engines(llama_dir):
    """Two engines on the same checkpoint: the replica that fails and the one that resumes."""
    return LLM(str(llama_dir), device="cpu", dtype="float32", block_size=4).engine, LLM(
        str(llama_dir), device="cpu", dtype="float32", block_size=4
    ).engine


def run(engine, rid: str, prompt, params, output=(), text_sent=0, until: int | None = None):
    """Step `engine` with one request (beside a busy neighbour) until it finishes or has
    produced `until` tokens in all (then it is aborted: its replica "dies")."""
    engine.add_request(rid, prompt, params, output_token_ids=list(output), emitted_text_len=text_sent)
    engine.add_request(f"{rid}-neighbour", [3, 1, 4, 1, 5], SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS))
    deltas = []
    while engine.has_unfinished_requests():
        for d in engine.step():
            if d.request_id == rid:
                deltas.append(d)
        if deltas and (deltas[-1].finished or (until and deltas[-1].num_output_tokens >= until)):
            break
    engine.abort_request(rid)
    engine.abort_request(f"{rid}-neighbour")
    while engine.has_unfinished_requests():
        engine.step()
    return deltas


def tokens(deltas) -> list[int]:
    return [t for d in deltas for t in d.new_token_ids]


def logprobs(deltas) -> list[dict]:
    return [lp for d in deltas for lp in d.new_logprobs or []]


PARAMS = {
    "greedy": dict(temperature=0.0, logprobs=2),
    "seeded": dict(temperature=1.0, seed=1234, top_k=20, logprobs=1),
    "seeded_penalised": dict(
        temperature=0.9, seed=7, frequency_penalty=1.5, presence_penalty=0.5, repetition_penalty=1.3
    ),
}


@pytest.mark.parametrize("kind", PARAMS)
@pytest.mark.parametrize("after", [1, 9])
def test_a_resumed_request_continues_as_the_undisturbed_one(engines, kind, after):
    first, second = engines
    params = dict(max_tokens=MAX_TOKENS, ignore_eos=True, **PARAMS[kind])
    whole = run(first, f"whole-{kind}-{after}", PROMPT, SamplingParams(**params))
    assert whole[-1].finish_reason == "length" and len(tokens(whole)) == MAX_TOKENS

    before = run(first, f"cut-{kind}-{after}", PROMPT, SamplingParams(**params), until=after)
    assert tokens(before) == tokens(whole)[:after]
    sent = "".join(d.new_text for d in before)
    out = tokens(before)
    rest = run(second, f"resumed-{kind}-{after}", PROMPT, SamplingParams(**params), output=out, text_sent=len(sent))

    assert out + tokens(rest) == tokens(whole)
    assert sent + "".join(d.new_text for d in rest) == "".join(d.new_text for d in whole)
    for mine, theirs in zip(logprobs(before) + logprobs(rest), logprobs(whole), strict=True):
        assert mine.keys() == theirs.keys()
        assert max(abs(mine[t] - theirs[t]) for t in mine) < 1e-4
    last = rest[-1]
    assert (last.finish_reason, last.num_prompt_tokens, last.num_output_tokens) == ("length", len(PROMPT), MAX_TOKENS)


def test_a_stop_string_spanning_the_seam_is_found(llama_dir):
    llm = LLM(str(llama_dir), device="cpu", dtype="float32", block_size=4)
    probe = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    text, ids = probe[0].outputs[0].text, probe[0].outputs[0].token_ids
    pieces = [llm.tokenizer.decode(ids[:i]) for i in range(len(ids) + 1)]
    # A two-character stop string: the last character of token `cut`'s text and the first of
    # the next one's, whose first occurrence is right there. The replica dies after `cut` tokens.
    cut, stop = next(
        (i, pieces[i][-1] + pieces[i + 1][len(pieces[i])])
        for i in range(2, len(ids) - 1)
        if pieces[i]
        and len(pieces[i + 1]) > len(pieces[i])
        and text.find(pieces[i][-1] + pieces[i + 1][len(pieces[i])]) == len(pieces[i]) - 1
    )
    params = dict(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop])
    engine = llm.engine
    whole = run(engine, "whole", PROMPT, SamplingParams(**params))
    assert whole[-1].stop_reason == stop and "".join(d.new_text for d in whole) == text[: len(pieces[cut]) - 1]

    before = run(engine, "cut", PROMPT, SamplingParams(**params), until=cut)
    sent = "".join(d.new_text for d in before)
    assert len(sent) < len(pieces[cut])  # the stop's first character was held back: not sent
    rest = run(engine, "resumed", PROMPT, SamplingParams(**params), output=tokens(before), text_sent=len(sent))
    assert sent + "".join(d.new_text for d in rest) == text[: len(pieces[cut]) - 1]
    assert (rest[-1].finish_reason, rest[-1].stop_reason) == ("stop", stop)
    assert len(rest) == 1  # found on the first token after the seam


def test_seeded_draws_depend_only_on_the_seed_and_the_output_position():
    logits = torch.randn(1, 64)
    params = SamplingParams(temperature=1.0, seed=99)
    sampler = Sampler(seed=5)
    undisturbed = Sequence("a", [1, 2, 3], params)
    draws = []
    for _ in range(12):  # each draw appended, as the engine does
        token = sampler(logits, [undisturbed]).token_ids[0]
        draws.append(token)
        undisturbed.token_ids.append(token)
    # Resumed at position 7 in another sampler (another process): the same draws from there on.
    resumed = Sequence("b", [1, 2, 3], params, output_token_ids=draws[:7])
    other = Sampler(seed=6)
    for expected in draws[7:]:
        token = other(logits, [resumed]).token_ids[0]
        assert token == expected
        resumed.token_ids.append(token)
    assert len(set(draws)) > 1  # positions draw differently: not one noise reused
    assert len({position_seed(99, i) for i in range(1000)} | {position_seed(100, i) for i in range(1000)}) == 2000
