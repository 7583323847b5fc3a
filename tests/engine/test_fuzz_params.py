"""Property-based fuzzing of request parameters: random combinations, valid and not (huge
integers, NaN and infinities, wrong types, negative values, empty and long stop lists).

(a) The gateway either refuses a body with a 400 naming one of its parameters, or turns it
    into parameters the engine accepts and that can be sent as strict JSON.
(b) Whatever SamplingParams accepts runs through real engine steps without raising, beside
    another request whose output it must not change.

Deterministic (derandomize) and bounded, so it runs the same on every machine.
"""

import json
import math

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from controlplane.gateway.core.body import parse_json
from controlplane.gateway.core.errors import OpenAIError
from controlplane.gateway.dialects.openai.request import parse_chat, parse_completion
from workers.engine import LLM, RequestError, SamplingParams

FUZZ = settings(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])

EDGE_INTS = [0, -1, 1, 2**31 - 1, 2**31, 2**63, 2**64 - 1, 2**64, -(2**63) - 1, 10**40]
WILD = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(EDGE_INTS),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e-300, 1e300, -0.0]),
    st.text(max_size=6),
    st.lists(st.integers(min_value=-5, max_value=400), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
STOPS = st.one_of(
    st.lists(st.text(max_size=3), max_size=6),  # incl. empty lists and empty strings
    st.lists(st.sampled_from(["x" * 5000, "\n", "The", "🚀"]), max_size=4),  # long ones too
    st.text(max_size=4),
)


@st.composite
def fuzzed(draw, plausible: dict):
    """Some of the parameters, each in or near its range; then up to two of them (often none)
    replaced by anything at all, so that valid combinations are common too."""
    fields = draw(st.fixed_dictionaries({}, optional=plausible))
    for name in draw(st.lists(st.sampled_from(sorted(plausible)), max_size=2, unique=True)):
        fields[name] = draw(WILD)
    return fields


GATEWAY_FIELDS = fuzzed(
    {
        "temperature": st.floats(min_value=-0.1, max_value=2.1),
        "top_p": st.floats(min_value=0, max_value=1.05),
        "top_k": st.integers(min_value=-3, max_value=400),
        "min_p": st.floats(min_value=0, max_value=1),
        "presence_penalty": st.floats(min_value=-2.1, max_value=2.1),
        "frequency_penalty": st.floats(min_value=-2.1, max_value=2.1),
        "repetition_penalty": st.floats(min_value=0.005, max_value=10.5),
        "seed": st.integers(min_value=-10, max_value=2**64 + 10),
        "max_tokens": st.integers(min_value=-1, max_value=2**31 + 1),
        "max_completion_tokens": st.integers(min_value=0, max_value=64),
        "stop": STOPS,
        "ignore_eos": st.booleans(),
        "logprobs": st.one_of(st.booleans(), st.integers(min_value=-1, max_value=21)),
        "top_logprobs": st.integers(min_value=-1, max_value=21),
        "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.one_of(st.booleans(), WILD)}),
        "n": st.integers(min_value=0, max_value=2),
    }
)


def root(param: str) -> str:
    """`stream_options.include_usage` -> `stream_options`; `messages[0].role` -> `messages`."""
    return param.split(".")[0].split("[")[0]


@settings(FUZZ, max_examples=300)
@given(fields=GATEWAY_FIELDS, kind=st.sampled_from(["chat", "completion"]), as_json=st.booleans())
def test_gateway_admits_only_what_the_engine_accepts(fields, kind, as_json):
    body = {"model": "m", **fields}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if kind == "chat" else {"prompt": "hi"})
    parse = parse_chat if kind == "chat" else parse_completion
    try:
        # As a client would send it (Python's json writes NaN and Infinity), or as a dict.
        req = parse(parse_json(json.dumps(body).encode()) if as_json else body)
    except OpenAIError as exc:
        event("refused")
        assert exc.status == 400
        assert exc.param is not None and root(exc.param) in body, (exc.param, exc.message)
        assert set(exc.body()["error"]) == {"message", "type", "param", "code"}
        assert len(exc.message) < 300
        return
    event("admitted")
    params = SamplingParams.from_wire(req.params)  # must not raise
    json.dumps(req.replica_message().to_wire(), allow_nan=False)  # strict JSON on the way to the replica
    if params.seed is not None:
        assert 0 <= params.seed < 2**64


ENGINE_FIELDS = fuzzed(
    {
        "temperature": st.sampled_from([0.0, 1e-6, 5e-5, 0.7, 1.0, 2.0, 50.0]),
        "top_p": st.floats(min_value=1e-6, max_value=1),
        "top_k": st.sampled_from([-1, 0, 1, 5, 319, 320, 10**6]),
        "min_p": st.floats(min_value=0, max_value=1),
        "presence_penalty": st.floats(min_value=-2, max_value=2),
        "frequency_penalty": st.floats(min_value=-2, max_value=2),
        "repetition_penalty": st.floats(min_value=0.01, max_value=10),
        "seed": st.sampled_from([0, 1, 2**32, 2**63, 2**64 - 1]),
        "max_tokens": st.sampled_from([1, 2, 5, 2**31 - 1]),
        "stop": STOPS,
        "stop_token_ids": st.lists(st.integers(min_value=0, max_value=400), max_size=4),
        "ignore_eos": st.booleans(),
        "logprobs": st.integers(min_value=0, max_value=20),
        "skip_special_tokens": st.booleans(),
    }
)
WITNESS_PROMPT, FUZZED_PROMPT = list(range(5, 16)), list(range(40, 52))
WITNESS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(llama_dir):
    llm = LLM(str(llama_dir), device="cpu", dtype="float32", block_size=4, max_model_len=64, num_kv_blocks=64)
    return llm.engine


@pytest.fixture(scope="module")
def witness_alone(engine):
    engine.add_request("alone", WITNESS_PROMPT, WITNESS)
    tokens = []
    while engine.has_unfinished_requests():
        tokens += [t for d in engine.step() for t in d.new_token_ids]
    return tokens


@settings(FUZZ, max_examples=80)
@given(kwargs=ENGINE_FIELDS)
def test_what_sampling_params_accepts_runs_beside_another_request(engine, witness_alone, kwargs):
    try:
        params = SamplingParams(**kwargs)
    except RequestError as exc:
        event("refused")
        assert exc.param in kwargs, (exc.param, str(exc))
        return
    event("ran")
    engine.add_request("fuzzed", FUZZED_PROMPT, params)
    engine.add_request("witness", WITNESS_PROMPT, WITNESS)
    witness, vocab = [], engine.model_config.vocab_size
    for _ in range(20):  # the witness needs 6 steps; the fuzzed request may run longer
        for delta in engine.step():
            assert all(0 <= t < vocab for t in delta.new_token_ids)
            if delta.new_logprobs is not None:
                assert all(math.isfinite(v) for lp in delta.new_logprobs for v in lp.values())
            if delta.request_id == "witness":
                witness += delta.new_token_ids
        if len(witness) == len(witness_alone):
            break
    engine.abort_request("fuzzed")
    assert witness == witness_alone
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks  # nothing leaked
