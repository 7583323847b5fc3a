"""Structured output through the real stack with the official `openai` client: JSON-schema
answers (20 schemas, streamed and not) parse and validate, a forced tool choice always yields a
tool call with valid arguments, vLLM's `structured_outputs` work, a disaggregated deployment
obeys the grammar from its first token, and what cannot compile is a 400 naming the problem."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from tests.support.platform import DEMO, DEMO_PD, platform
from workers.bench.structured import SCHEMAS

pytestmark = [pytest.mark.timeout(300), pytest.mark.django_db]
ASK = [{"role": "user", "content": "Answer in JSON."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "days": {"type": "integer", "maximum": 7, "minimum": 1},
            },
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory):
    env = {"PD_LOCAL_PREFILL_TOKENS": "0"}
    with platform(django_db_blocker, tmp_path_factory, "grammar", deployments=[DEMO, DEMO_PD], env=env) as p:
        yield p


@pytest.fixture
def client(stack):
    return stack.client()


def json_schema(i: int) -> dict:
    return {"type": "json_schema", "json_schema": {"name": f"schema_{i}", "schema": SCHEMAS[i], "strict": True}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_json_schema_answers_parse_and_validate_for_twenty_schemas(client, stream):
    assert len(SCHEMAS) == 20
    for i, schema in enumerate(SCHEMAS):
        kwargs = {"model": "demo", "messages": ASK, "response_format": json_schema(i), "max_tokens": 96}
        kwargs["temperature"], kwargs["seed"] = (0.8, i) if stream else (0, None)
        if stream:
            chunks = list(client.chat.completions.create(**kwargs, stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        else:
            choice = client.chat.completions.create(**kwargs).choices[0]
            text, finish = choice.message.content, [choice.finish_reason]
        assert finish == ["stop"], (i, text)
        jsonschema.validate(json.loads(text), schema)


def test_json_object_and_the_parse_helper(client):
    from pydantic import BaseModel, Field

    class City(BaseModel):
        city: str = Field(max_length=10)
        days: int = Field(ge=1, le=7)

    parsed = client.chat.completions.parse(
        model="demo", messages=ASK, response_format=City, temperature=0, max_tokens=64
    )
    assert isinstance(parsed.choices[0].message.parsed, City)
    answer = client.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "hi"}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=128,
    )
    choice = answer.choices[0]
    if choice.finish_reason == "stop":  # the tiny model may ramble in a key until max_tokens
        assert isinstance(json.loads(choice.message.content), dict)
    else:
        assert choice.finish_reason == "length" and choice.message.content.startswith("{")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_choice_required_always_yields_a_valid_tool_call(client, stream):
    # Questions the demo model answers in text when the tool choice is its own.
    for seed, question in enumerate(["hi", "What is the capital of France?", "Tell me a joke.", "What time is it?"]):
        kwargs = {"model": "demo", "messages": [{"role": "user", "content": question}], "tools": [WEATHER, CLOCK],
                  "tool_choice": "required", "temperature": 0.7, "seed": seed, "max_tokens": 96}  # fmt: skip
        if stream:
            deltas = [c.choices[0] for c in client.chat.completions.create(**kwargs, stream=True) if c.choices]
            calls = [tc.function for d in deltas for tc in (d.delta.tool_calls or [])]
            finish = [d.finish_reason for d in deltas if d.finish_reason]
        else:
            choice = client.chat.completions.create(**kwargs).choices[0]
            calls, finish = [tc.function for tc in choice.message.tool_calls or []], [choice.finish_reason]
        assert finish == ["tool_calls"], question
        (call,) = calls
        arguments = json.loads(call.arguments)
        if call.name == "get_weather":
            jsonschema.validate(arguments, WEATHER["function"]["parameters"])
        else:
            assert (call.name, arguments) == ("get_time", {})
    named = client.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "hi"}],
        tools=[WEATHER, CLOCK],
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=96,
    )
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_structured_outputs_regex_choice_and_grammar(client):
    regex = client.completions.create(model="demo", prompt="Code:", max_tokens=16, temperature=0.9, seed=1,
                                      extra_body={"structured_outputs": {"regex": r"[A-Z]{2}-\d{3}"}})  # fmt: skip
    assert re.fullmatch(r"[A-Z]{2}-\d{3}", regex.choices[0].text) and regex.choices[0].finish_reason == "stop"
    choice = client.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "Is Paris in France?"}],
        temperature=0,
        max_tokens=8,
        extra_body={"structured_outputs": {"choice": ["yes", "no", "perhaps"]}},
    )
    assert choice.choices[0].message.content in ("yes", "no", "perhaps")
    ebnf = 'root ::= "(" [0-9]{1,2} (", " [0-9]{1,2}){0,2} ")"'
    grammar = client.chat.completions.create(
        model="demo", messages=ASK, temperature=0, max_tokens=32, extra_body={"structured_outputs": {"grammar": ebnf}}
    )
    assert re.fullmatch(r"\(\d{1,2}(, \d{1,2}){0,2}\)", grammar.choices[0].message.content)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_disaggregated_deployment_obeys_the_grammar_from_the_first_token(client, stream):
    for i in (6, 13, 17):
        kwargs = {"messages": ASK, "response_format": json_schema(i), "temperature": 0, "max_tokens": 96}
        want = client.chat.completions.create(model="demo", **kwargs).choices[0].message.content
        if stream:
            raw = client.chat.completions.with_raw_response.create(model="demo-pd", stream=True, **kwargs)
            assert raw.headers.get("x-switchyard-prefill-replica")  # the prefill replica sampled token 1
            text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        else:
            text = client.chat.completions.create(model="demo-pd", **kwargs).choices[0].message.content
        assert text == want
        jsonschema.validate(json.loads(text), SCHEMAS[i])


@pytest.mark.parametrize("model", ["demo", "demo-pd"])
def test_what_cannot_compile_is_a_400_naming_the_problem(client, model):
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/missing"}}}
    cases = [
        ({"response_format": bad_schema}, "response_format", "cannot compile the JSON schema"),
        ({"extra_body": {"structured_outputs": {"grammar": "root ::= nowhere"}}}, "structured_outputs",
         'Rule "nowhere" is not defined'),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_stock"}}},
         "tool_choice.function.name", "not in 'tools'"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "object"}}},
         "response_format.json_schema.schema", "must be a JSON schema object"),
    ]  # fmt: skip
    for stream in (False, True):
        for kwargs, param, words in cases:
            with pytest.raises(openai.BadRequestError) as err:
                client.chat.completions.create(model=model, messages=ASK, max_tokens=8, stream=stream, **kwargs)
            body = err.value.body
            assert err.value.status_code == 400 and body["param"] == param, body
            assert words in body["message"]


def test_a_disaggregated_request_with_a_grammar_is_one_trace_and_inspected(stack):
    """Through a web process that exports traces: the trace of a constrained request that a
    prefill replica computed holds the grammar's compilation, the queue, the prefill, the KV
    transfer and the decode; the inspector keeps the same request with its times."""
    import httpx
    import redis
    from django.conf import settings

    from controlplane.gateway import inspector
    from tests.support.otlp import otlp_receiver
    from tests.support.stack import wait_for

    with (
        otlp_receiver() as (endpoint, spans),
        stack.web("web-traced", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_BSP_SCHEDULE_DELAY="100") as base,
    ):
        body = {
            "model": "demo-pd",
            "messages": ASK,
            "response_format": json_schema(4),
            "temperature": 0,
            "max_tokens": 64,
        }
        response = httpx.post(
            f"{base}/v1/chat/completions",
            json=body,
            timeout=60,
            headers={"Authorization": f"Bearer {stack.keys['key']}"},
        )
        assert response.status_code == 200, response.text
        assert response.headers.get("x-switchyard-prefill-replica")
        rid = response.json()["id"]

        def trace():
            roots = [
                s
                for s in spans
                if not s.parent_span_id
                and any(a.key == "gen_ai.response.id" and a.value.string_value == rid for a in s.attributes)
            ]
            return (
                roots[0]
                if roots and any(s.trace_id == roots[0].trace_id and s.name == "decode" for s in spans)
                else None
            )

        root = wait_for(trace, 10, f"the trace of {rid}")
    children = sorted(
        (s for s in spans if s.trace_id == root.trace_id and s.parent_span_id == root.span_id),
        key=lambda s: s.start_time_unix_nano,
    )
    names = [s.name for s in children]
    assert set(names) == {"grammar", "queue", "prefill", "kv_transfer", "decode"}, names
    assert names.index("grammar") < names.index("queue") < names.index("prefill") < names.index("decode")
    transfer = next(s for s in children if s.name == "kv_transfer")
    assert transfer.end_time_unix_nano <= next(s for s in children if s.name == "decode").start_time_unix_nano
    rc = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    [kept] = [r for r in inspector.recent(rc, "demo-pd") if r["id"] == rid]
    assert kept["prefill_replica"] is not None and kept["kv_transfer_ms"] is not None and kept["grammar_ms"] >= 0
    assert kept["status"] == "ok" and kept["completion_tokens"] >= 1
