"""Structured output in the engine: the grammar's mask in the sampler, per sequence, inside
continuous batching (chunked prefill, preemption, prefix caching), speculative verification,
disaggregated decode and resume; the compile cache; the errors."""

import json
import re
import subprocess
import sys

import jsonschema
import pytest
import torch

from tests.engine.test_speculative_decode import NGRAM  # drafts at every step, rejected or not
from workers.engine import LLM, SamplingParams
from workers.engine.config import EngineConfig
from workers.engine.errors import RequestError
from workers.engine.llm_engine import LLMEngine
from workers.engine.sampler import Sampler

DEMO = "workers/demo/model"
QUESTIONS = [
    "Tell me about Alice.",
    "What is the capital of France?",
    "Write a JSON object describing a cat.",
    "hi",
    "Give me a list of three numbers.",
    "Who are you? Answer in one word.",
]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
WEATHER = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 10},
            "days": {"type": "integer", "minimum": 1, "maximum": 30},
        },
        "required": ["city"],
    },
}


def grammar(kind: str, **fields) -> dict:
    return {"type": kind, **fields}


def _chat(llm: LLM, question: str) -> list[int]:
    return llm.engine.tokenizer.prompt_ids(messages=[{"role": "user", "content": question}])


@pytest.fixture(scope="module")
def llm():
    return LLM(DEMO, device="cpu", dtype="float32", block_size=4)


def run(llm: LLM, prompts, params) -> list:
    params = params if isinstance(params, list) else [params] * len(prompts)
    return [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]


def test_mask_forbids_what_the_grammar_forbids_and_leaves_other_rows_alone(llm):
    state = llm.engine.grammars.state(grammar("choice", choice=["yes", "no"]))

    class Row:
        def __init__(self, grammar):
            self.params, self.grammar = SamplingParams(temperature=0.0), grammar
            self.token_ids, self.num_prompt_tokens, self.num_output_tokens = [5], 1, 0

    vocab = llm.engine.model_config.vocab_size
    logits = torch.zeros(2, vocab)
    logits[:, 7] = 10.0  # the best token for both rows
    result = Sampler()(logits, [Row(state), Row(None)])
    tok = llm.engine.tokenizer
    assert tok.decode([result.token_ids[0]]) in ("y", "ye", "yes", "n", "no")
    assert result.token_ids[1] == 7
    assert logits[0, 7] == 10.0  # the caller's logits are not masked in place


@pytest.mark.parametrize(
    "spec, check",
    [
        (grammar("json_schema", schema=PERSON), lambda text: jsonschema.validate(json.loads(text), PERSON)),
        (grammar("json_object"), lambda text: isinstance(json.loads(text), dict) or pytest.fail(text)),
        (grammar("regex", regex=r"[a-z]{2,5}-\d{3}"), lambda text: re.fullmatch(r"[a-z]{2,5}-\d{3}", text) or 1 / 0),
        (grammar("choice", choice=["red", "green", "blue sky"]), lambda text: text in ("red", "green", "blue sky")),
        (
            grammar("grammar", grammar='root ::= "(" [0-9]{1,3} (", " [0-9]{1,3}){0,3} ")"'),
            lambda text: re.fullmatch(r"\(\d+(, \d+)*\)", text) or 1 / 0,
        ),
    ],
)
def test_every_output_matches_its_grammar_greedy_and_sampled(llm, spec, check):
    prompts = [_chat(llm, q) for q in QUESTIONS]
    for params in (
        SamplingParams(temperature=0.0, max_tokens=48, grammar=spec),
        SamplingParams(temperature=1.0, seed=3, max_tokens=48, grammar=spec),
    ):
        outs = run(llm, prompts, params)
        for out in outs:
            if out.finish_reason == "stop":
                check(out.text)
        # Any JSON object lets the tiny model ramble inside a key until max_tokens (the output is
        # then cut, as OpenAI's is); the other grammars bound what it can write.
        done = sum(out.finish_reason == "stop" for out in outs)
        assert done == len(outs) or (spec["type"] == "json_object" and done > 0), [o.text for o in outs]


def test_a_forced_tool_call_is_one_call_the_gateway_parser_reads(llm):
    from controlplane.gateway.tool_calls import ToolCallParser

    spec = grammar(
        "tool_call",
        tools=[
            WEATHER,
            {"name": "noop", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
        ],
    )
    for out in run(
        llm, [_chat(llm, q) for q in QUESTIONS], SamplingParams(temperature=0.7, seed=1, max_tokens=64, grammar=spec)
    ):
        assert out.finish_reason == "stop"
        parsed = ToolCallParser().feed(out.text)
        (call,) = parsed
        assert call.name in ("get_weather", "noop")
        if call.name == "get_weather":
            jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])


def test_constrained_greedy_equals_free_greedy_where_the_free_output_matches(llm):
    prompts = [_chat(llm, q) for q in QUESTIONS]
    free = run(llm, prompts, SamplingParams(temperature=0.0, max_tokens=40))
    assert all(o.finish_reason == "stop" for o in free)
    words = r"[A-Za-z ,.?'!]*"  # permissive: most of the demo model's answers are such text
    matching = [i for i, o in enumerate(free) if re.fullmatch(words, o.text)]
    assert len(matching) >= 3
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, grammar=grammar("choice", choice=[o.text, "nothing else"]))
        for o in free
    ] + [SamplingParams(temperature=0.0, max_tokens=40, grammar=grammar("regex", regex=words))] * len(matching)
    constrained = run(llm, prompts + [prompts[i] for i in matching], params)
    assert [o.token_ids for o in constrained] == [o.token_ids for o in free] + [free[i].token_ids for i in matching]


def test_free_requests_are_unchanged_by_constrained_neighbours_with_chunking_and_preemption():
    alone = LLM(DEMO, device="cpu", dtype="float32", block_size=4, enable_prefix_caching=False)
    prompts = [_chat(alone, q) for q in QUESTIONS]
    free = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    seeded = SamplingParams(temperature=0.9, seed=11, max_tokens=24, ignore_eos=True)
    constrained = SamplingParams(temperature=0.0, max_tokens=40, grammar=grammar("json_schema", schema=PERSON))
    want_free = run(alone, prompts, free)
    want_seeded = run(alone, prompts, seeded)
    want_constrained = run(alone, prompts, constrained)

    # A 16-token budget chunks every prefill; 64 blocks of 4 cannot hold them all: preemption.
    tight = LLM(
        DEMO, device="cpu", dtype="float32", block_size=4, num_kv_blocks=64, max_num_batched_tokens=16, max_num_seqs=18
    )
    mixed = run(tight, prompts * 3, [free] * 6 + [constrained] * 6 + [seeded] * 6)
    assert tight.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in mixed[:6]] == [o.token_ids for o in want_free]
    assert [o.token_ids for o in mixed[6:12]] == [o.token_ids for o in want_constrained]
    assert [o.token_ids for o in mixed[12:]] == [o.token_ids for o in want_seeded]
    for out in mixed[6:12]:
        jsonschema.validate(json.loads(out.text), PERSON)
    # With the prefix cache on, a second round hits it and answers the same.
    cached = LLM(DEMO, device="cpu", dtype="float32", block_size=4)
    for _ in range(2):
        again = run(cached, prompts * 2, [free] * 6 + [constrained] * 6)
        assert [o.token_ids for o in again] == [o.token_ids for o in want_free + want_constrained]
    assert cached.engine.block_manager.hits > 0


def test_speculative_verification_masks_each_position():
    plain = LLM(DEMO, device="cpu", dtype="float32", block_size=4)
    spec = LLM(
        DEMO, device="cpu", dtype="float32", block_size=4, speculative_config={**NGRAM, "disable_by_batch_size": 16}
    )
    # Repetitive JSON in the prompt so that prompt lookup proposes drafts inside the grammar.
    questions = [f'Repeat: {{"name": "ab", "age": {i}, "tags": ["a", "b"]}} {{"name": "ab"' for i in range(4)]
    prompts = [_chat(plain, q) for q in questions + QUESTIONS]
    params = [SamplingParams(temperature=0.0, max_tokens=40, grammar=grammar("json_schema", schema=PERSON))] * len(
        prompts
    ) + [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)] * len(prompts)
    want = run(plain, prompts * 2, params)
    got = run(spec, prompts * 2, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    stats = spec.engine.speculation_stats()
    assert stats["num_draft_tokens"] > 0 and stats["num_accepted_tokens"] > 0
    for out in got[: len(prompts)]:
        jsonschema.validate(json.loads(out.text), PERSON)


def _steps(eng: LLMEngine, rid: str) -> list:
    deltas = []
    while eng.has_unfinished_requests():
        deltas += [d for d in eng.step() if d.request_id == rid]
    return deltas


def test_disaggregated_decode_advances_the_grammar_by_the_prefill_replicas_first_token(llm):
    params = SamplingParams(temperature=0.0, max_tokens=40, grammar=grammar("json_schema", schema=PERSON))
    p = _chat(llm, QUESTIONS[0])
    (want,) = run(llm, [p], params)
    prefill = LLMEngine(EngineConfig(model=DEMO, dtype="float32", block_size=4, num_kv_blocks=64))
    decode = LLMEngine(EngineConfig(model=DEMO, dtype="float32", block_size=4, num_kv_blocks=64))
    first_params = SamplingParams(temperature=0.0, max_tokens=1, grammar=params.grammar)
    prefill.add_request("r", p, first_params, hold_blocks=True)
    (first,) = _steps(prefill, "r")
    src = prefill.held["r"].block_table[: prefill.block_manager.blocks_needed(len(p))]
    dst = decode.reserve_blocks(len(p))
    decode.runner.kv_cache[:, :, dst] = prefill.runner.kv_cache[:, :, src]
    prefill.release_held("r")
    head = decode.add_prefilled_request("r", p, params, dst, first.new_token_ids[0])
    tokens = [t for d in [head, *_steps(decode, "r")] for t in d.new_token_ids]
    assert tokens == want.token_ids
    assert first.new_token_ids[0] == want.token_ids[0]


def test_a_resumed_request_continues_its_grammar(llm):
    params = SamplingParams(temperature=0.0, max_tokens=40, grammar=grammar("json_schema", schema=PERSON))
    p = _chat(llm, QUESTIONS[2])
    (want,) = run(llm, [p], params)
    eng = llm.engine
    eng.add_request("resumed", p, params, output_token_ids=want.token_ids[:5])
    rest = [t for d in _steps(eng, "resumed") for t in d.new_token_ids]
    assert want.token_ids[:5] + rest == want.token_ids
    with pytest.raises(RequestError, match="does not match its grammar"):
        eng.add_request("bad", p, params, output_token_ids=_chat(llm, "x")[:3])


def test_grammars_are_compiled_once_per_spec_and_the_cache_is_bounded(llm):
    grammars = llm.engine.grammars
    before = grammars.compiles
    spec = grammar("regex", regex="once[0-9]")
    for _ in range(3):
        grammars.state(dict(spec))
    assert grammars.compiles == before + 1
    for i in range(grammars.cache_size + 5):
        grammars.compile(grammar("regex", regex=f"x{i}"))
    assert len(grammars.cache) == grammars.cache_size


@pytest.mark.parametrize(
    "spec, message, param",
    [
        (grammar("json_schema", schema={"$ref": "#/nowhere"}), "cannot compile the JSON schema", "response_format"),
        (grammar("regex", regex="(unclosed"), "cannot compile the regex", "structured_outputs"),
        (grammar("grammar", grammar="root ::= missing"), 'Rule "missing" is not defined', "structured_outputs"),
        (grammar("choice", choice=[]), "non-empty list", "structured_outputs"),
        (grammar("xml"), "type is one of", "grammar"),
        (grammar("json_schema", schema={}, extra=1), "unknown grammar field", "response_format"),
    ],
)
def test_a_grammar_that_cannot_be_compiled_is_a_request_error_naming_the_parameter(llm, spec, message, param):
    with pytest.raises(RequestError, match=re.escape(message)) as caught:
        llm.engine.add_request("x", [5, 6], SamplingParams(grammar=spec))
    assert caught.value.param == param
    assert "x" not in llm.engine.requests


def test_an_engine_loads_xgrammar_only_for_its_first_grammar():
    """xgrammar loads transformers (0.8 s of CPU): an engine starts without it, and a replica
    whose requests ask for no grammar, most of them, never loads it; the first grammar loads it
    (a replica's on its intake thread) and is followed."""
    script = f"""
import sys
from workers.engine import LLM, SamplingParams
llm = LLM({DEMO!r}, max_model_len=256)
llm.generate(["hi"], SamplingParams(max_tokens=4, temperature=0))
print("free", "xgrammar" in sys.modules)
choice = {{"type": "choice", "choice": ["yes", "no"]}}
[out] = llm.generate(["hi"], SamplingParams(max_tokens=8, temperature=0, grammar=choice))
print("grammar", "xgrammar" in sys.modules, out.outputs[0].text)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "free False" in lines
    assert any(line in ("grammar True yes", "grammar True no") for line in lines), lines
