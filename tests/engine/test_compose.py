"""Features that meet in one request: grammars under speculation, `n` under speculation and
disaggregation, and a failure while stepping one request, which ends that request alone.
(tests/engine/test_feature_matrix.py crosses every feature pairwise; these are the cases each
of those bugs was first seen in, kept as plain examples.)"""

import json
import re

import jsonschema
import pytest

from tests.engine.test_disaggregation import handoff
from tests.engine.test_speculative_decode import NGRAM
from tests.engine.test_structured import PERSON, WEATHER
from workers.engine import LLM, SamplingParams
from workers.engine.config import EngineConfig
from workers.engine.faults import CRASH, FAULT, TOKENS_BEFORE_FAULT
from workers.engine.llm_engine import LLMEngine

DEMO = "workers/demo/model"
EAGLE3 = {"method": "eagle3", "model": "workers/demo/draft", "num_speculative_tokens": 3, "draft_backoff": 0}
SPECS = {"ngram": {**NGRAM, "disable_by_batch_size": 16}, "eagle3": {**EAGLE3, "disable_by_batch_size": 16}}
QUESTIONS = ["What is the weather in Paris?", "Tell me about Alice.", "Write a JSON object describing a cat."]
GRAMMARS = {
    "tool_call": {"type": "tool_call", "tools": [WEATHER]},
    "json_schema": {"type": "json_schema", "schema": PERSON},
    "json_object": {"type": "json_object"},
    "regex": {"type": "regex", "regex": "[a-z]{1,8}( [a-z]{1,8}){0,3}"},
    "choice": {"type": "choice", "choice": ["yes", "no", "maybe"]},
}


def validates(kind: str, text: str) -> bool:
    if kind == "tool_call":
        m = re.fullmatch(r"<tool_call>(.*)</tool_call>", text, re.S)
        call = m and json.loads(m.group(1))
        return bool(call) and call["name"] == WEATHER["name"] and _valid(call["arguments"], WEATHER["parameters"])
    if kind == "json_schema":
        return _valid(json.loads(text), PERSON)
    if kind == "json_object":
        return isinstance(json.loads(text), dict)
    if kind == "regex":
        return re.fullmatch(GRAMMARS["regex"]["regex"], text) is not None
    return text in GRAMMARS["choice"]["choice"]


def _valid(value, schema) -> bool:
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


def prompts(llm: LLM) -> list[list[int]]:
    return [llm.engine.tokenizer.prompt_ids(messages=[{"role": "user", "content": q}]) for q in QUESTIONS]


@pytest.fixture(scope="module")
def plain():
    return LLM(DEMO, device="cpu", dtype="float32", block_size=4)


@pytest.fixture(scope="module", params=sorted(SPECS))
def speculating(request):
    return LLM(DEMO, device="cpu", dtype="float32", block_size=4, speculative_config=SPECS[request.param])


def outputs(llm: LLM, params: SamplingParams) -> list:
    return [c for o in llm.generate([{"prompt_token_ids": p} for p in prompts(llm)], params) for c in o.outputs]


@pytest.mark.parametrize("kind", sorted(GRAMMARS))
def test_constrained_outputs_under_speculation_equal_those_without(plain, speculating, kind):
    """Before drafts were cut to what the grammar accepts, EAGLE-3 drafted past the grammar's
    stop token and xgrammar raised while the verify rows were masked: the engine died."""
    for params in (
        SamplingParams(temperature=0.0, max_tokens=48, grammar=GRAMMARS[kind]),
        SamplingParams(temperature=0.9, seed=11, max_tokens=48, grammar=GRAMMARS[kind]),
    ):
        want, got = outputs(plain, params), outputs(speculating, params)
        assert [c.token_ids for c in got] == [c.token_ids for c in want]
        for c in got:
            assert c.finish_reason == "stop" and validates(kind, c.text), c.text
    if kind != "choice":  # one or two tokens: nothing to look up or draft
        assert speculating.engine.speculation_stats()["num_draft_tokens"] > 0
    assert speculating.engine.block_manager.num_free_blocks == speculating.engine.block_manager.num_blocks


def test_a_draft_is_cut_where_the_grammar_refuses_or_ends(plain):
    state = plain.engine.grammars.state(GRAMMARS["choice"])
    tok = plain.engine.tokenizer
    yes, eos, wrong = tok.encode("yes"), plain.engine.eos_token_ids[0], tok.encode("Q")[0]
    assert state.valid_prefix([*yes, eos, *yes]) == [*yes, eos]  # nothing after the end
    assert state.valid_prefix([yes[0], wrong, *yes]) == [yes[0]]  # nothing from the first refusal
    assert state.valid_prefix([wrong]) == []
    assert not state.terminated and state.accept(yes[0])  # the state is where it was


@pytest.mark.parametrize("method", sorted(SPECS))
def test_n_under_speculation_greedy_samples_equal_n_1_and_seeds_reproduce(plain, method):
    llm = LLM(DEMO, device="cpu", dtype="float32", block_size=4, speculative_config=SPECS[method])
    greedy = SamplingParams(n=3, temperature=0.0, max_tokens=24, ignore_eos=True, grammar=GRAMMARS["json_object"])
    single = outputs(
        plain, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, grammar=GRAMMARS["json_object"])
    )
    got = llm.generate([{"prompt_token_ids": p} for p in prompts(llm)], greedy)
    for out, want in zip(got, single, strict=True):
        assert [c.token_ids for c in out.outputs] == [want.token_ids] * 3
    seeded = SamplingParams(n=3, temperature=2.0, seed=5, max_tokens=24)
    first = [
        [c.token_ids for c in o.outputs] for o in llm.generate([{"prompt_token_ids": p} for p in prompts(llm)], seeded)
    ]
    again = [
        [c.token_ids for c in o.outputs]
        for o in plain.generate([{"prompt_token_ids": p} for p in prompts(llm)], seeded)
    ]
    assert first == again  # and equal to the run without speculation
    assert any(len({tuple(t) for t in samples}) > 1 for samples in first)  # the samples differ
    assert llm.engine.speculation_stats()["num_draft_tokens"] > 0
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_n_on_a_disaggregated_deployment_prefills_once_and_forks_on_the_decode_side(plain):
    prefill = LLMEngine(EngineConfig(model=DEMO, dtype="float32", block_size=4))
    decode = LLMEngine(EngineConfig(model=DEMO, dtype="float32", block_size=4))
    prompt = prompts(plain)[1]
    for params in (
        SamplingParams(n=3, temperature=0.0, max_tokens=16, ignore_eos=True),
        SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=16, ignore_eos=True),
    ):
        want = plain.generate([{"prompt_token_ids": prompt}], params)[0].outputs
        computed_before = decode.stats()["generated_tokens"]
        deltas, _ = handoff(prefill, decode, f"r{params.temperature}", prompt, params)
        got = [[t for d in deltas if d.index == i for t in d.new_token_ids] for i in range(3)]
        assert got == [c.token_ids for c in want]
        assert decode.stats()["generated_tokens"] - computed_before == 3 * 16
    assert decode.block_manager.num_free_blocks == decode.block_manager.num_blocks
    assert prefill.block_manager.num_free_blocks == prefill.block_manager.num_blocks


@pytest.fixture
def faults(monkeypatch):
    monkeypatch.setenv("SWITCHYARD_TEST_FAULTS", "1")


@pytest.mark.parametrize("spec", [None, "ngram", "eagle3"])
def test_a_failure_while_stepping_one_request_ends_that_request_alone(plain, faults, spec):
    llm = LLM(DEMO, device="cpu", dtype="float32", block_size=4, speculative_config=SPECS.get(spec))
    ids = prompts(llm)
    params = [
        SamplingParams(temperature=0.0, max_tokens=20, grammar=GRAMMARS["json_object"]),
        SamplingParams(temperature=0.0, max_tokens=20, grammar={"type": "regex", "regex": FAULT}),
        SamplingParams(n=3, temperature=0.0, max_tokens=20, grammar={"type": "regex", "regex": FAULT}),
        SamplingParams(temperature=0.8, seed=3, max_tokens=20),
    ]
    got = llm.generate([{"prompt_token_ids": p} for p in [ids[0], ids[1], ids[2], ids[0]]], params)
    want = plain.generate([{"prompt_token_ids": p} for p in [ids[0], ids[0]]], [params[0], params[3]])
    assert [c.token_ids for c in got[0].outputs] == [c.token_ids for c in want[0].outputs]
    assert [c.token_ids for c in got[3].outputs] == [c.token_ids for c in want[1].outputs]
    for out in (got[1], got[2]):
        assert [c.finish_reason for c in out.outputs] == ["error"] * len(out.outputs)
        assert all("injected fault" in c.error for c in out.outputs)
        assert max(len(c.token_ids) for c in out.outputs) <= TOKENS_BEFORE_FAULT + 3
    engine = llm.engine
    assert engine.stats()["request_errors"] == 2 and not engine.requests
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    # The engine is as good as new: the same batch without the faulty requests runs as it should.
    again = llm.generate([{"prompt_token_ids": ids[0]}], params[0])
    assert again[0].outputs[0].token_ids == want[0].outputs[0].token_ids


def test_faults_are_off_without_the_test_switch(plain):
    params = SamplingParams(temperature=0.0, max_tokens=40, grammar={"type": "regex", "regex": CRASH})
    out = plain.generate([{"prompt_token_ids": prompts(plain)[0]}], params)
    assert out[0].outputs[0].text == CRASH and out[0].outputs[0].finish_reason == "stop"
