"""The Responses and Anthropic Messages APIs at the gateway, without processes: what each request
becomes (the chat messages, tools and grammar the replica is sent), every parameter not built
refused naming it, and errors in each API's own shape (the stack-level behaviour is in
tests/integration/test_agent_apis.py)."""

from __future__ import annotations

import json

import httpx
import pytest
import redis
from channels.db import database_sync_to_async
from django.conf import settings

from controlplane.catalog.models import Model
from controlplane.config.asgi import application
from controlplane.deployments.models import Deployment
from controlplane.gateway.core.errors import OpenAIError
from controlplane.gateway.dialects.anthropic.request import parse_count_tokens, parse_messages
from controlplane.gateway.dialects.anthropic.views import MessageBuilder
from controlplane.gateway.dialects.responses.request import parse_responses
from controlplane.gateway.dialects.responses.views import ResponseBuilder
from controlplane.gateway.models import StoredResponse
from controlplane.gateway.services import create_api_key
from tests.support.played_replica import played_replica
from workers.protocol.replica import DeltaEvent, ErrorEvent

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": SCHEMA}
CHAT_WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather in a city", "parameters": SCHEMA},
}
CLAUDE_WEATHER = {"name": "get_weather", "description": "Weather in a city", "input_schema": SCHEMA}
BASE = {"model": "demo", "input": "hi"}
CLAUDE = {"model": "demo", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def chat_of(body: dict, history=()):
    return parse_responses(body).generation_request(list(history))


# -- Responses: what a request becomes -----------------------------------------------------------------
def test_input_items_instructions_and_history_become_the_chat():
    parsed = parse_responses({
        "model": "demo", "instructions": "Be brief.", "max_output_tokens": 7, "temperature": 0.5, "top_p": 0.9,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather "}, {"type": "input_text",
                                                                                     "text": "in Oslo?"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me see."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": '{"temperature_c": 3}'},
            {"role": "developer", "content": "Answer in words."},
        ],
    })  # fmt: skip
    history = [{"role": "user", "content": "Earlier"}, {"role": "assistant", "content": "Yes."}]
    req = parsed.generation_request(history)
    assert req.messages == [
        {"role": "system", "content": "Be brief."},
        *history,
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Let me see.", "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "content": '{"temperature_c": 3}', "tool_call_id": "call_1"},
        {"role": "system", "content": "Answer in words."},
    ]  # fmt: skip
    assert (req.params.max_tokens, req.params.temperature, req.params.top_p) == (7, 0.5, 0.9)
    assert parsed.input_messages == req.messages[3:]  # what a stored response keeps: no instructions, no history
    assert chat_of(BASE).messages == [{"role": "user", "content": "hi"}]


def test_function_tools_and_tool_choice_become_the_chat_endpoints():
    req = chat_of({**BASE, "tools": [WEATHER]})
    assert req.tools == [CHAT_WEATHER] and req.tool_choice == "auto" and req.params.grammar is None
    required = chat_of({**BASE, "tools": [WEATHER], "tool_choice": "required"}).params.grammar
    assert required == {"type": "tool_call", "tools": [{"name": "get_weather", "parameters": SCHEMA}]}
    named = chat_of(
        {**BASE, "tools": [WEATHER, {**WEATHER, "name": "other"}], "tool_choice": {"type": "function", "name": "other"}}
    )
    assert [t["name"] for t in named.params.grammar["tools"]] == ["other"]
    assert chat_of({**BASE, "tools": [WEATHER], "tool_choice": "none"}).template_tools is None
    # strict arguments are honoured where they are enforced: a forced call.
    assert chat_of({**BASE, "tools": [{**WEATHER, "strict": True}], "tool_choice": "required"}).params.grammar


def test_text_format_becomes_the_structured_output_grammar():
    fmt = {"type": "json_schema", "name": "city", "schema": SCHEMA, "strict": True}
    assert chat_of({**BASE, "text": {"format": fmt}}).params.grammar == {"type": "json_schema", "schema": SCHEMA}
    assert chat_of({**BASE, "text": {"format": {"type": "json_object"}}}).params.grammar == {"type": "json_object"}
    assert chat_of({**BASE, "text": {"format": {"type": "text"}}}).params.grammar is None


def test_values_that_ask_for_nothing_unbuilt_are_accepted():
    parsed = parse_responses({**BASE, "background": False, "include": [], "truncation": "disabled", "store": False,
                              "service_tier": "auto", "parallel_tool_calls": True, "top_logprobs": 0,
                              "prompt_cache_retention": "in_memory", "metadata": {"app": "x"}, "user": "u",
                              "stream_options": {"include_obfuscation": False}, "reasoning": None,
                              "tools": [{**WEATHER, "strict": False}], "prompt_cache_key": "conv-1"})  # fmt: skip
    assert parsed.store is False and parsed.metadata == {"app": "x"}
    assert parsed.generation_request([]).prompt_cache_key == "conv-1"


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"background": True}, "background", "unsupported"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported"),
        ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[0].type", "unsupported"),
        ({"include": ["reasoning.encrypted_content"]}, "include", "unsupported"),
        ({"reasoning": {"effort": "low"}}, "reasoning", "unsupported"),
        ({"truncation": "auto"}, "truncation", "unsupported"),
        ({"conversation": "conv_1"}, "conversation", "unsupported"),
        ({"prompt": {"id": "p"}}, "prompt", "unsupported"),
        ({"max_tool_calls": 3}, "max_tool_calls", "unsupported"),
        ({"top_logprobs": 2}, "top_logprobs", "unsupported"),
        ({"service_tier": "scale"}, "service_tier", "unsupported"),
        ({"prompt_cache_retention": "24h"}, "prompt_cache_retention", "unsupported"),
        ({"parallel_tool_calls": False}, "parallel_tool_calls", "unsupported"),
        ({"text": {"verbosity": "low"}}, "text.verbosity", "unsupported"),
        ({"stream_options": {"include_obfuscation": True}}, "stream_options.include_obfuscation", "unsupported"),
        ({"frobnicate": 1}, "frobnicate", "unknown_parameter"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type", "unsupported"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input[0].content[0]", "unsupported"),
        ({"tools": [WEATHER], "tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice.type",
         "unsupported"),
        ({"tools": [{**WEATHER, "strict": True}]}, "tools[0].strict", "unsupported"),
        ({"temperature": 3}, "temperature", "invalid_value"),
        ({"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
        ({"previous_response_id": "chatcmpl-1"}, "previous_response_id", "invalid_value"),
        ({"input": ""}, "input", "invalid_value"),
        ({"input": []}, "input", "invalid_type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "invalid_value"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name",
         "invalid_value"),
        ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": 3}}}, "text.format.schema",
         "invalid_type"),
        ({"text": {"format": {"type": "grammar"}}}, "text.format.type", "invalid_value"),
    ],
)  # fmt: skip
def test_responses_parameters_not_built_or_wrong_are_400s_naming_them(fields, param, code):
    with pytest.raises(OpenAIError) as err:
        parse_responses({**BASE, **fields})
    assert (err.value.status, err.value.param, err.value.code) == (400, param, code), err.value.message
    assert "'messages'" not in err.value.message and "'max_tokens'" not in err.value.message


# -- Anthropic: what a request becomes ------------------------------------------------------------------
def test_anthropic_blocks_become_the_chat():
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
    parsed = parse_messages({
        "model": "demo", "max_tokens": 9,
        "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        "stop_sequences": ["\n\n", "END"], "top_k": 5, "top_p": 0.5, "temperature": 0.2, "metadata": {"user_id": "u"},
        "tools": [CLAUDE_WEATHER], "stream": True,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?", "cache_control":
                                          {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, use]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3 C"},
                                         {"type": "text", "text": "And?"}]},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                          "content": [{"type": "text", "text": "timeout"}]}]},
        ],
    })  # fmt: skip
    req = parsed.req
    call = {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    assert req.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [call]},
        {"role": "tool", "content": "3 C", "tool_call_id": "toolu_1"},
        {"role": "user", "content": "And?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "Error: timeout", "tool_call_id": "toolu_1"},
    ]
    p = req.params
    assert (p.max_tokens, p.stop, p.top_k, p.top_p, p.temperature) == (9, ["\n\n", "END"], 5, 0.5, 0.2)
    assert parsed.stream and req.tools == [CHAT_WEATHER] and req.tool_choice == "auto"


def test_anthropic_tool_choice_maps_onto_the_enforced_choice():
    def grammar(choice, tools=(CLAUDE_WEATHER, {**CLAUDE_WEATHER, "name": "other"})):
        return parse_messages({**CLAUDE, "tools": list(tools), "tool_choice": choice}).req

    assert [t["name"] for t in grammar({"type": "any"}).params.grammar["tools"]] == ["get_weather", "other"]
    named = grammar({"type": "tool", "name": "other", "disable_parallel_tool_use": True}).params.grammar
    assert [t["name"] for t in named["tools"]] == ["other"]
    assert grammar({"type": "auto"}).params.grammar is None
    assert grammar({"type": "none"}).template_tools is None
    fmt = parse_messages({**CLAUDE, "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}})
    assert fmt.req.params.grammar == {"type": "json_schema", "schema": SCHEMA}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0}, "top_p"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
        ({"tools": [{"name": "f"}]}, "tools.0.input_schema"),
        ({"tools": [{**CLAUDE_WEATHER, "strict": True}]}, "tools.0.strict"),
        ({"tools": [CLAUDE_WEATHER], "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}},
         "tool_choice.disable_parallel_tool_use"),
        ({"tools": [CLAUDE_WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.function.name"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
        ({"metadata": {"user_id": "u", "tenant": "t"}}, "metadata"),
        ({"container": "c"}, "container"),
        ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "mcp_servers"),
        ({"output_config": {"effort": "high"}}, "output_config.effort"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages.0.content.0.type"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
         "messages.0.content.0.type"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer is"}]},
         "messages.1.role"),
        ({"messages": []}, "messages"),
    ],
)  # fmt: skip
def test_anthropic_parameters_not_built_or_wrong_are_400s_naming_them(fields, param):
    body = {k: v for k, v in {**CLAUDE, **fields}.items() if v is not None}
    with pytest.raises(OpenAIError) as err:
        parse_messages(body)
    assert (err.value.status, err.value.param) == (400, param), err.value.message
    assert "response_format" not in err.value.message and "'stop'" not in err.value.message


def test_count_tokens_takes_the_prompt_part_only():
    prompt = {k: v for k, v in CLAUDE.items() if k != "max_tokens"}
    assert parse_count_tokens({**prompt, "tools": [CLAUDE_WEATHER]}).req.template_tools == [CHAT_WEATHER]
    for name, value in [("max_tokens", 5), ("stream", True), ("temperature", 0)]:
        with pytest.raises(OpenAIError) as err:
            parse_count_tokens({**prompt, name: value})
        assert err.value.param == name and err.value.code == "unknown_parameter"


# -- over HTTP: each API's error shape ---------------------------------------------------------------------
@pytest.fixture
def keys(db, django_user_model) -> dict:
    model = Model.objects.create(name="tiny", source="/models/tiny", status=Model.Status.READY)
    Deployment.objects.create(slug="demo", model=model)  # running, no replica: admitted requests get a 503
    owner, other = django_user_model.objects.create_user("owner"), django_user_model.objects.create_user("other")
    StoredResponse.objects.create(id="resp_theirs", owner=other, conversation=[], response={"id": "resp_theirs"})
    return {"mine": create_api_key(name="mine", owner=owner)[1], "theirs": create_api_key(name="t", owner=other)[1]}


def anthropic_error(response, status: int, kind: str) -> str:
    assert response.status_code == status, response.content[:300]
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind
    return body["error"]["message"]


def test_anthropic_auth_by_x_api_key_and_errors_in_anthropics_shape(client, keys):
    def post(body, **headers):
        return client.post("/v1/messages", json.dumps(body), "application/json", headers=headers)

    version = {"anthropic-version": "2023-06-01"}
    assert "x-api-key" in anthropic_error(post(CLAUDE, **version), 401, "authentication_error")
    anthropic_error(post(CLAUDE, **{"x-api-key": "sy-not-a-key"}, **version), 401, "authentication_error")
    # Authenticated (either header) and admitted: the deployment has no ready replica.
    anthropic_error(post(CLAUDE, **{"x-api-key": keys["mine"]}, **version), 503, "overloaded_error")
    anthropic_error(post(CLAUDE, Authorization=f"Bearer {keys['mine']}"), 503, "overloaded_error")
    auth = {"x-api-key": keys["mine"]}
    anthropic_error(post({**CLAUDE, "model": "nope"}, **auth), 404, "not_found_error")
    assert "max_tokens" in anthropic_error(post({**CLAUDE, "max_tokens": -1}, **auth), 400, "invalid_request_error")
    anthropic_error(
        client.post("/v1/messages", b"{nope", "application/json", headers=auth), 400, "invalid_request_error"
    )
    anthropic_error(client.get("/v1/messages", headers=auth), 405, "invalid_request_error")
    # The gateway cannot read this model's tokenizer, so it cannot count (the replicas would tokenise).
    prompt = json.dumps({k: v for k, v in CLAUDE.items() if k != "max_tokens"})
    counted = client.post("/v1/messages/count_tokens", prompt, "application/json", headers=auth)
    assert "cannot be counted" in anthropic_error(counted, 501, "api_error")


@pytest.mark.asyncio
async def test_a_messages_body_over_the_limit_is_anthropics_413(settings):
    settings.MAX_REQUEST_BYTES = 1000
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        response = await http.post(
            "/v1/messages", content=b"{" + b" " * 2000 + b"}", headers={"content-type": "application/json"}
        )
    assert response.status_code == 413 and response.json()["error"]["type"] == "request_too_large"


def test_stored_responses_are_their_owners_only(client, keys):
    def call(method, path, key, body=None):
        return client.generic(
            method,
            path,
            json.dumps(body) if body else "",
            "application/json",
            headers={"Authorization": f"Bearer {keys[key]}"},
        )

    assert call("GET", "/v1/responses/resp_theirs", "theirs").json() == {"id": "resp_theirs"}
    for method in ("GET", "DELETE"):
        missing = call(method, "/v1/responses/resp_theirs", "mine")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert call("GET", "/v1/responses/resp_theirs?include[]=x", "theirs").json()["error"]["code"] == "unsupported"
    # Continuing another owner's response is refused before any replica is involved.
    refused = call("POST", "/v1/responses", "mine", {**BASE, "previous_response_id": "resp_theirs"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "previous_response_not_found"
    # The owner's continuation is admitted (no replica is ready: 503).
    assert call("POST", "/v1/responses", "theirs", {**BASE, "previous_response_id": "resp_theirs"}).status_code == 503
    assert call("DELETE", "/v1/responses/resp_theirs", "theirs").json()["deleted"] is True
    assert not StoredResponse.objects.exists()
    assert call("POST", "/v1/responses", "mine", {"input": "hi"}).json()["error"]["param"] == "model"


# -- what an answer becomes: replica deltas through each API's builder ----------------------------------
def deltas(*texts: str, finish: str = "stop", stop_reason=None, usage=None) -> list[DeltaEvent]:
    out = [DeltaEvent(id="r", text=t, token_ids=[i]) for i, t in enumerate(texts)]
    out[-1].finish_reason, out[-1].stop_reason = finish, stop_reason
    out[-1].usage = usage or {"prompt_tokens": 40, "completion_tokens": len(texts), "cached_tokens": 32}
    return out


CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
TEXT_THEN_CALL = ("Let me", " check.", " \n<tool_", CALL[len("<tool_") :], "\n")


def build_response(body: dict, texts, **kwargs) -> tuple[list[dict], dict]:
    parsed = parse_responses(body)
    builder = ResponseBuilder(parsed, parsed.generation_request([]), 1700000000, [])
    events = builder.start()
    for delta in deltas(*texts, **kwargs):
        events += builder.feed(delta)
    return events, builder


def test_a_response_streams_text_then_a_function_call_in_order():
    events, builder = build_response({**BASE, "tools": [WEATHER]}, TEXT_THEN_CALL)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"].removeprefix("response.") for e in events] == [
        "created", "in_progress", "output_item.added", "content_part.added", "output_text.delta",
        "output_text.delta", "output_text.done", "content_part.done", "output_item.done", "output_item.added",
        "function_call_arguments.delta", "function_call_arguments.done", "output_item.done", "completed",
    ]  # fmt: skip
    final = events[-1]["response"]
    message, call = final["output"]
    assert message["content"][0]["text"] == "Let me check." == events[6]["text"]  # the whitespace before the call
    assert (call["type"], call["name"], json.loads(call["arguments"])) == (
        "function_call",
        "get_weather",
        {"city": "Oslo"},
    )
    assert call["call_id"].startswith("call_") and events[9]["output_index"] == 1
    assert final["usage"] == {
        "input_tokens": 40,
        "input_tokens_details": {"cached_tokens": 32},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 45,
    }
    # What a continuation starts with: the input, then the answer as the chat's assistant message.
    assert builder.conversation() == [{"role": "user", "content": "hi"}, {
        "role": "assistant", "content": "Let me check.", "tool_calls": [{
            "id": call["call_id"], "type": "function", "function": {"name": "get_weather",
                                                                    "arguments": call["arguments"]}}]}]  # fmt: skip


def test_a_plain_response_keeps_every_character_and_a_cut_one_is_incomplete():
    events, _ = build_response(BASE, ("Hello", " there", "\n"))
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Hello there\n"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "Hello there\n"
    events, _ = build_response(BASE, ("Hello", " there"), finish="length")
    assert events[-1]["type"] == "response.incomplete"
    final = events[-1]["response"]
    assert (final["status"], final["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    # The tags of a tool call are plain text when no tools were offered.
    events, _ = build_response(BASE, (CALL,))
    assert [item["type"] for item in events[-1]["response"]["output"]] == ["message"]


def build_message(body: dict, texts, **kwargs) -> list[tuple[str, dict]]:
    builder = MessageBuilder(parse_messages(body))
    events = builder.start()
    for delta in deltas(*texts, **kwargs):
        events += builder.feed(delta)
    return events


def test_a_message_streams_text_and_tool_use_blocks_and_ends_with_its_stop_reason():
    events = build_message({**CLAUDE, "tools": [CLAUDE_WEATHER]}, TEXT_THEN_CALL)
    assert [name for name, _ in events] == [
        "message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
        "message_stop",
    ]  # fmt: skip
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert (start["content"], start["stop_reason"], start["usage"]["output_tokens"]) == ([], None, 0)
    use = events[6][1]["content_block"]
    assert (use["type"], use["name"], use["input"], events[6][1]["index"]) == ("tool_use", "get_weather", {}, 1)
    assert use["id"].startswith("toolu_")
    assert json.loads(events[7][1]["delta"]["partial_json"]) == {"city": "Oslo"}
    delta = events[9][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    # Anthropic counts input tokens read from the cache apart.
    assert delta["usage"] == {
        "input_tokens": 8,
        "cache_read_input_tokens": 32,
        "cache_creation_input_tokens": 0,
        "output_tokens": 5,
    }


@pytest.mark.parametrize(
    ("finish", "stop_reason", "expected"),
    [
        ("stop", None, ("end_turn", None)),
        ("stop", 2, ("end_turn", None)),
        ("length", None, ("max_tokens", None)),
        ("stop", "END", ("stop_sequence", "END")),
    ],
)
def test_anthropic_stop_reasons(finish, stop_reason, expected):
    (_, delta), _ = build_message(CLAUDE, ("Hi",), finish=finish, stop_reason=stop_reason)[-2:]
    assert (delta["delta"]["stop_reason"], delta["delta"]["stop_sequence"]) == expected


def test_a_tool_call_whose_arguments_are_no_object_stays_text():
    builder = MessageBuilder(parse_messages({**CLAUDE, "tools": [CLAUDE_WEATHER]}))
    for delta in deltas('<tool_call>{"name": "get_weather", "arguments": "Oslo"}</tool_call>'):
        builder.feed(delta)
    message = builder.message(delta)
    assert [b["type"] for b in message["content"]] == ["text"] and message["stop_reason"] == "end_turn"
    assert "get_weather" in message["content"][0]["text"]


# -- a replica failing mid-answer -----------------------------------------------------------------------
def fails_after_one_token(rid: str, prompt_tokens: int) -> list:
    # A played replica: an engine failing a request after its first token cannot be caused at will.
    return [DeltaEvent(rid, "Hel", [7]), ErrorEvent(rid, 500, "the engine failed", code="engine_error")]


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_failure_mid_stream_ends_each_apis_stream_in_its_own_shape(django_user_model):
    from tests.controlplane.test_session_turns import serve

    replica = await database_sync_to_async(serve)()  # these close their connections after
    owner = await database_sync_to_async(django_user_model.objects.create_user)("streamer")
    _, key = await database_sync_to_async(create_api_key)(name="s", owner=owner)
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    transport = httpx.ASGITransport(app=application)
    auth = {"Authorization": f"Bearer {key}"}
    try:
        with played_replica(client, replica, answer=fails_after_one_token):
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=30) as http:
                responses = await http.post(
                    "/v1/responses", headers=auth, json={"model": "turns", "input": "hi", "stream": True}
                )
                messages = await http.post(
                    "/v1/messages", headers=auth, json={**CLAUDE, "model": "turns", "stream": True}
                )
    finally:
        client.close()
    assert responses.status_code == 200 and messages.status_code == 200
    events = [json.loads(line[6:]) for line in responses.text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events][-2:] == ["response.output_text.delta", "response.failed"]
    failed = events[-1]["response"]
    # The engine's own code passes through (an engine_error is not a lost replica: no failover).
    assert failed["status"] == "failed" and failed["error"]["code"] == "engine_error"
    assert "the engine failed" in failed["error"]["message"]
    assert not await database_sync_to_async(StoredResponse.objects.exists)()  # a failed response is not kept
    names = [line[7:] for line in messages.text.splitlines() if line.startswith("event: ")]
    assert names[-2:] == ["content_block_delta", "error"]
    error = json.loads(messages.text.rstrip().splitlines()[-1][6:])
    assert error == {"type": "error", "error": {"type": "api_error", "message": error["error"]["message"]}}
