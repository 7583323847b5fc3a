"""Tool calls that cannot be split: the gateway's parser reads a call's JSON (strings and escapes
included) so a `</tool_call>` inside an argument does not end it; a forced call comes back as a
call in every API, streamed or not (the real engine writes such an argument under a forced
call's grammar); and tool definitions are checked whatever the `tool_choice`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import redis
from channels.db import database_sync_to_async
from django.conf import settings as django_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.config.asgi import application
from controlplane.gateway.core.errors import OpenAIError
from controlplane.gateway.dialects.anthropic.request import parse_messages
from controlplane.gateway.dialects.openai.request import parse_chat, parse_completion
from controlplane.gateway.dialects.responses.request import parse_responses
from controlplane.gateway.services import create_api_key
from controlplane.gateway.tool_calls import CLOSE, OPEN, ToolCall, ToolCallParser
from tests.support.played_replica import played_replica
from workers.engine.errors import RequestError
from workers.engine.sampling_params import SamplingParams
from workers.protocol.replica import DeltaEvent

TRICKY = '</tool_call> <tool_call> \\ " { } [ ] < > / tool_call'  # what a string may hold that looks like structure


def feed_all(parser: ToolCallParser, pieces) -> list:
    out = []
    for piece in pieces:
        out += parser.feed(piece)
    return out + parser.finish()


def split(out: list) -> tuple[str, list[ToolCall]]:
    return "".join(p for p in out if isinstance(p, str)), [p for p in out if isinstance(p, ToolCall)]


def forced(name: str, arguments: dict) -> str:
    """A call as a forced call's grammar writes it (workers/engine/structured.py): compact JSON."""
    return f"{OPEN}{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}{CLOSE}"


# -- the parser ------------------------------------------------------------------------------------
def test_a_close_tag_inside_an_argument_does_not_end_the_call_wherever_the_text_is_cut():
    arguments = {"html": "<b>x</b></tool_call>", "quoted": 'say "</tool_call>" \\', "tail": "}}</tool_call>"}
    text = forced("render", arguments)
    cuts = [[text[:i], text[i:]] for i in range(len(text) + 1)]
    cuts += [[text[i : i + size] for i in range(0, len(text), size)] for size in (1, 2, 3, 5, 7, 11)]
    for pieces in cuts:
        content, calls = split(feed_all(ToolCallParser(), pieces))
        assert content == "", pieces
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [("render", arguments)], pieces


@settings(max_examples=200, deadline=None)
@given(
    before=st.text(alphabet="ab <>/_\n", max_size=12).filter(lambda t: OPEN not in t),
    calls=st.lists(
        st.dictionaries(st.sampled_from("xyz"), st.text(alphabet=TRICKY, max_size=30)), min_size=1, max_size=3
    ),
    cuts=st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=40),
)
def test_any_arguments_cut_anywhere_come_back_whole(before, calls, cuts):
    text = before + "\n".join(forced(f"f{i}", args) for i, args in enumerate(calls))
    pieces, at = [], 0
    for n in cuts * (len(text) // sum(cuts) + 1):
        pieces.append(text[at : at + n])
        at += n
    content, found = split(feed_all(ToolCallParser(), pieces))
    assert content == before + "\n" * (len(calls) - 1)
    assert [(c.name, json.loads(c.arguments)) for c in found] == [(f"f{i}", a) for i, a in enumerate(calls)]


def test_text_before_a_call_is_shown_at_once_and_the_call_when_it_closes():
    parser = ToolCallParser()
    assert parser.feed("Let me check. <tool_c") == ["Let me check. "]  # the tag's start is held back
    assert parser.feed('all>{"name": "f", "arguments": {"s": "</tool_call>') == []
    assert parser.feed('"}}</tool_') == []
    (call,) = parser.feed("call>Done.")[:1]
    assert (call.name, json.loads(call.arguments)) == ("f", {"s": "</tool_call>"})
    assert parser.finish() == [] and parser.calls == [call]
    parser = ToolCallParser()
    assert [p.name for p in parser.feed(forced("f", {}) + "Done.")[:1]] == ["f"]


def test_a_close_tag_outside_the_json_ends_a_broken_call_as_text_and_later_calls_still_count():
    broken = '<tool_call>{"name": "a", "arguments": {"x": 1}</tool_call>'  # one brace short
    parser = ToolCallParser()
    assert parser.feed(broken) == [broken]  # shown when its tag arrives, not held to the end
    content, calls = split(parser.feed(" then " + forced("b", {"y": 2})) + parser.finish())
    assert content == " then " and [c.name for c in calls] == ["b"]
    # Text after the object and before the tag: not a call either; everything is shown.
    junk = '<tool_call>{"name": "a", "arguments": {}} and more</tool_call>'
    assert "".join(feed_all(ToolCallParser(), [junk, "x"])) == junk + "x"


def test_at_the_end_a_complete_object_is_a_call_and_anything_else_is_text():
    content, calls = split(feed_all(ToolCallParser(), ['<tool_call>{"name": "f", "arguments": {}}</tool_']))
    assert content == "" and [c.name for c in calls] == ["f"]  # max_tokens cut the closing tag
    cut = '<tool_call>{"name": "f", "arguments": {"s": "</tool_call> and'
    assert feed_all(ToolCallParser(), [cut]) == [cut]  # a string never closed: nothing is lost


# -- a forced call through the engine and every API ------------------------------------------------
SAID = 'say "</tool_call>" \\ {}'  # the argument the grammar makes the model write
RENDER_SCHEMA = {
    "type": "object",
    "properties": {"html": {"type": "string", "const": SAID}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["html", "n"],
    "additionalProperties": False,
}
RENDER = {"type": "function", "function": {"name": "render", "parameters": RENDER_SCHEMA}}
ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def forced_output() -> list[tuple[str, int]]:
    """What the demo model writes under the gateway's grammar for a forced call of RENDER: its
    text token by token."""
    from workers.engine import LLM, SamplingParams

    req = parse_chat({"model": "m", "messages": ASK, "tools": [RENDER], "tool_choice": "required"})
    llm = LLM("workers/demo/model", device="cpu", dtype="float32", block_size=4)
    tok = llm.engine.tokenizer
    params = SamplingParams(temperature=0, max_tokens=96, grammar=req.params.grammar)
    [out] = llm.generate(
        [{"prompt_token_ids": tok.prompt_ids(messages=req.messages, tools=req.template_tools)}], [params]
    )
    assert out.outputs[0].finish_reason == "stop"
    ids = out.outputs[0].token_ids
    texts = [tok.decode(ids[:i]) for i in range(len(ids) + 1)]
    return [(texts[i + 1][len(texts[i]) :], token) for i, token in enumerate(ids)]


def test_the_engine_writes_a_close_tag_inside_a_forced_calls_argument_and_it_stays_one_call(forced_output):
    text = "".join(piece for piece, _ in forced_output)
    assert text.count(CLOSE) == 2  # the argument's and the call's own
    content, calls = split(feed_all(ToolCallParser(), [piece for piece, _ in forced_output]))
    assert content == ""
    [call] = calls
    assert call.name == "render" and json.loads(call.arguments)["html"] == SAID


def _sse(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


def _chat(body: dict, stream: bool) -> tuple[str, list[tuple[str, dict]], str]:
    """(content, [(name, arguments)], finish_reason) of a chat completion."""
    if not stream:
        [choice] = body["choices"]
        message = choice["message"]
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]
        return message["content"] or "", calls, choice["finish_reason"]
    deltas = [c["choices"][0] for c in _sse(body) if c["choices"]]
    calls = [
        (tc["function"]["name"], json.loads(tc["function"]["arguments"]))
        for d in deltas
        for tc in d["delta"].get("tool_calls") or []
    ]
    content = "".join(d["delta"].get("content") or "" for d in deltas)
    return content, calls, next(d["finish_reason"] for d in deltas if d["finish_reason"])


def _responses(body, stream: bool) -> tuple[str, list[tuple[str, dict]], str]:
    events = _sse(body) if stream else [{"type": "response.completed", "response": body}]
    final = events[-1]["response"]
    if stream:
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    else:
        text = "".join(p["text"] for item in final["output"] if item["type"] == "message" for p in item["content"])
    calls = [(i["name"], json.loads(i["arguments"])) for i in final["output"] if i["type"] == "function_call"]
    return text, calls, final["status"]


def _messages(body, stream: bool) -> tuple[str, list[tuple[str, dict]], str]:
    if not stream:
        text = "".join(b["text"] for b in body["content"] if b["type"] == "text")
        return text, [(b["name"], b["input"]) for b in body["content"] if b["type"] == "tool_use"], body["stop_reason"]
    events = _sse(body)
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    names = [
        e["content_block"]["name"]
        for e in events
        if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"
    ]
    arguments = "".join(e["delta"].get("partial_json", "") for e in events if e["type"] == "content_block_delta")
    calls = [(name, json.loads(arguments)) for name in names]
    return text, calls, next(e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta")


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_forced_call_is_a_call_in_every_api_streamed_or_not(forced_output, django_user_model):
    from tests.controlplane.test_session_turns import serve

    def answer(rid: str, prompt_tokens: int) -> list:  # the engine's output, a token a delta
        events = [DeltaEvent(rid, piece, [token]) for piece, token in forced_output]
        events[-1].finish_reason = "stop"
        events[-1].usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(events), "cached_tokens": 0}
        return events

    replica = await database_sync_to_async(serve)()
    owner = await database_sync_to_async(django_user_model.objects.create_user)("caller")
    _, key = await database_sync_to_async(create_api_key)(name="k", owner=owner)
    flat = {"type": "function", "name": "render", "parameters": RENDER_SCHEMA}
    claude = {"name": "render", "input_schema": RENDER_SCHEMA}
    asks = [
        ("/v1/chat/completions", {"messages": ASK, "tools": [RENDER], "tool_choice": "required"}, _chat, "tool_calls"),
        ("/v1/chat/completions", {"messages": ASK, "tools": [RENDER], "tool_choice": {
            "type": "function", "function": {"name": "render"}}}, _chat, "tool_calls"),
        ("/v1/responses", {"input": "hi", "tools": [flat], "tool_choice": "required", "store": False}, _responses,
         "completed"),
        ("/v1/responses", {"input": "hi", "tools": [flat], "tool_choice": {"type": "function", "name": "render"},
                           "store": False}, _responses, "completed"),
        ("/v1/messages", {"max_tokens": 96, "messages": ASK, "tools": [claude], "tool_choice": {"type": "any"}},
         _messages, "tool_use"),
        ("/v1/messages", {"max_tokens": 96, "messages": ASK, "tools": [claude], "tool_choice": {
            "type": "tool", "name": "render"}}, _messages, "tool_use"),
    ]  # fmt: skip
    client = redis.Redis.from_url(django_settings.REDIS_URL, decode_responses=True)
    transport = httpx.ASGITransport(app=application)
    answers = []
    try:
        with played_replica(client, replica, answer=answer):
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=30) as http:
                for path, body, read, finish in asks:
                    for stream in (False, True):
                        r = await http.post(
                            path,
                            headers={"Authorization": f"Bearer {key}"},
                            json={**body, "model": "turns", "stream": stream},
                        )
                        assert r.status_code == 200, r.text
                        answers.append((path, stream, read(r.text if stream else r.json(), stream), finish))
    finally:
        client.close()
    for path, stream, (text, calls, finished), finish in answers:
        assert (text, finished) == ("", finish), (path, stream)
        [(name, arguments)] = calls
        assert name == "render" and arguments["html"] == SAID, (path, stream)


# -- tool definitions and schemas, checked whatever the tool_choice --------------------------------
GOOD = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
# (tools as (name, parameters), the index and field at fault, words of the message)
PROBLEMS = {
    "empty name": ([("a", GOOD), ("", GOOD)], 1, "name", "non-empty"),
    "blank name": ([("a", GOOD), ("  ", GOOD)], 1, "name", "non-empty"),
    "duplicate name": ([("a", GOOD), ("b", GOOD), ("a", {})], 2, "name", '"a" is also the name of tools'),
    "remote $ref": ([("a", {"type": "object", "properties": {"city": {"$ref": "http://example.com/city.json"}}})], 0,
                    "parameters", "remote $ref 'http://example.com/city.json' is not supported; inline the schema"),
    "relative $ref": ([("a", {"$ref": "defs.json#/City"})], 0, "parameters", "remote $ref 'defs.json#/City'"),
    "anchor $ref": ([("a", {"$ref": "#city", "$defs": {"c": {"$anchor": "city"}}})], 0, "parameters",
                    "$ref '#city' is not supported"),
    "dangling $ref": ([("a", {"type": "object", "properties": {"c": {"$ref": "#/$defs/City"}}})], 0, "parameters",
                      "$ref '#/$defs/City' points at nothing"),
    "invalid schema": ([("a", {"type": "object", "properties": {"city": {"type": "town"}}})], 0, "parameters",
                       "invalid JSON schema at properties.city.type"),
    "not an object": ([("a", {"type": "string"})], 0, "parameters", "'type': 'object'"),
}  # fmt: skip
DIALECTS = {
    "chat": (
        lambda tools, choice: parse_chat({"model": "m", "messages": ASK, "tools": tools, "tool_choice": choice}),
        lambda name, schema: {"type": "function", "function": {"name": name, "parameters": schema}},
        {"auto": "auto", "none": "none", "required": "required",
         "named": {"type": "function", "function": {"name": "a"}}},
        lambda i, field: f"tools[{i}].function.{field}",
    ),
    "responses": (
        lambda tools, choice: parse_responses({"model": "m", "input": "hi", "tools": tools, "tool_choice": choice}),
        lambda name, schema: {"type": "function", "name": name, "parameters": schema},
        {"auto": "auto", "none": "none", "required": "required", "named": {"type": "function", "name": "a"}},
        lambda i, field: f"tools[{i}].{field}",
    ),
    "messages": (
        lambda tools, choice: parse_messages({"model": "m", "max_tokens": 8, "messages": ASK, "tools": tools,
                                              "tool_choice": choice}),
        lambda name, schema: {"name": name, "input_schema": schema},
        {"auto": {"type": "auto"}, "none": {"type": "none"}, "required": {"type": "any"},
         "named": {"type": "tool", "name": "a"}},
        lambda i, field: f"tools.{i}.{'input_schema' if field == 'parameters' else field}",
    ),
}  # fmt: skip


@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.parametrize("choice", ["auto", "none", "required", "named"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_bad_tool_definition_is_a_400_naming_it_whatever_the_tool_choice(dialect, choice, problem):
    parse, tool, choices, param = DIALECTS[dialect]
    tools, index, field, words = PROBLEMS[problem]
    with pytest.raises(OpenAIError) as err:
        parse([tool(name, schema) for name, schema in tools], choices[choice])
    assert (err.value.status, err.value.param) == (400, param(index, field))
    assert words in err.value.message and param(index, field) in err.value.message


@pytest.mark.parametrize("choice", ["auto", "none", "required", "named"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_refs_inside_the_schema_and_ref_lookalikes_are_accepted(dialect, choice):
    parse, tool, choices, _ = DIALECTS[dialect]
    schema = {
        "type": "object",
        "properties": {
            "city": {"$ref": "#/$defs/City"},
            "$ref": {"type": "string", "enum": ["http://example.com/a.json"]},  # a parameter named $ref
            "raw": {"const": {"$ref": "http://example.com/b.json"}},  # data, not a reference
            "tree": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2},
        },
        "$defs": {"City": {"type": "string", "maxLength": 20}},
    }
    parse([tool("a", schema), tool("b", {})], choices[choice])


FORMATS = {
    "chat": (lambda schema: parse_chat({"model": "m", "messages": ASK, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}}),
        "response_format.json_schema.schema"),
    "responses": (lambda schema: parse_responses({"model": "m", "input": "hi", "text": {"format": {
        "type": "json_schema", "name": "x", "schema": schema, "strict": True}}}), "text.format.schema"),
    "messages": (lambda schema: parse_messages({"model": "m", "max_tokens": 8, "messages": ASK, "output_config": {
        "format": {"type": "json_schema", "schema": schema}}}), "output_config.format.schema"),
    "structured_outputs": (lambda schema: parse_completion({"model": "m", "prompt": "hi", "structured_outputs": {
        "json": schema}}), "structured_outputs.json"),
}  # fmt: skip


@pytest.mark.parametrize("ref", ["http://example.com/person.json", "https://example.com/s#/$defs/P", "person.json"])
@pytest.mark.parametrize("api", FORMATS)
def test_a_remote_ref_in_a_json_schema_format_is_a_400_naming_it(api, ref):
    parse, param = FORMATS[api]
    with pytest.raises(OpenAIError) as err:
        parse({"type": "object", "properties": {"who": {"type": "array", "items": {"$ref": ref}}}})
    assert (err.value.status, err.value.param) == (400, param)
    assert f"remote $ref '{ref}' is not supported; inline the schema" in err.value.message


def test_the_engine_refuses_what_the_gateway_does():
    """A replica trusts no sender: the spec's checks are the protocol's, run by both ends."""
    remote = {"type": "object", "properties": {"a": {"$ref": "http://example.com/a.json"}}}
    specs = [
        ({"type": "json_schema", "schema": remote}, "response_format", "remote $ref"),
        ({"type": "tool_call", "tools": [{"name": "f", "parameters": remote}]}, "tool_choice", "remote $ref"),
        ({"type": "tool_call", "tools": [{"name": "f"}, {"name": "f"}]}, "tool_choice", "unique"),
        ({"type": "tool_call", "tools": [{"name": ""}]}, "tool_choice", "non-empty"),
    ]
    for spec, param, words in specs:
        with pytest.raises(RequestError) as err:
            SamplingParams(grammar=spec)
        assert err.value.param == param and words in str(err.value)


def test_bad_tools_are_400s_in_each_apis_error_shape(client, django_user_model):
    _, key = create_api_key(name="k", owner=django_user_model.objects.create_user("shapes"))
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    twice = [("a", GOOD), ("a", GOOD)]
    for path, dialect, extra in (
        ("/v1/chat/completions", "chat", {"messages": ASK}),
        ("/v1/responses", "responses", {"input": "hi"}),
        ("/v1/messages", "messages", {"messages": ASK, "max_tokens": 8}),
    ):
        _, tool, _, param = DIALECTS[dialect]
        body = {"model": "m", **extra, "tools": [tool(name, schema) for name, schema in twice]}
        r = client.post(path, body, content_type="application/json", **auth)
        assert r.status_code == 400, r.content
        if dialect == "messages":
            error = r.json()
            assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
            assert error["error"]["message"].startswith(param(1, "name") + " must be unique")
        else:
            error = r.json()["error"]
            assert (error["type"], error["param"]) == ("invalid_request_error", param(1, "name"))


def test_the_gateways_checks_load_no_torch_and_take_one_pass_over_a_large_schema():
    code = (
        "import sys, time; from controlplane.gateway.dialects.openai.request import parse_chat;"
        "props = {f'p{i}': {'type': 'string', 'description': 'x' * 100} for i in range(2000)};"
        "tool = {'type': 'function', 'function': {'name': 'f', 'parameters': {'type': 'object', 'properties': props}}};"
        "t = time.perf_counter();"
        "parse_chat({'model': 'm', 'messages': [{'role': 'user', 'content': 'x'}], 'tools': [tool]});"
        "print(time.perf_counter() - t, sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'xgrammar')))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seconds, loaded = out.stdout.split(" ", 1)
    assert loaded.strip() == "[]"
    # On the gateway's event loop: jsonschema's 2020-12 metaschema took 2 s for this one.
    assert float(seconds) < 1.0
