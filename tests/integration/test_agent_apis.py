"""The APIs agents speak, through the real stack, with the official clients: OpenAI's Responses
API (`client.responses.create`: plain, tools and a function_call_output round trip, streaming,
`previous_response_id`, `store=False`) and Anthropic's Messages API (`client.messages.create`,
a tool use round trip, `client.messages.stream`)."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.support.platform import DEMO, platform

pytestmark = [pytest.mark.timeout(300), pytest.mark.django_db]
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": WEATHER_SCHEMA,
}
# The current Anthropic SDK has no `temperature` argument; the API (and this server) still read it.
GREEDY = {"temperature": 0}
CLAUDE_WEATHER = {"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER_SCHEMA}


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory):
    keys = {"key": {}, "same_owner": {}, "stranger": {"owner": "stranger"}}
    with platform(django_db_blocker, tmp_path_factory, "agent", deployments=[DEMO], keys=keys) as p:
        yield p


@pytest.fixture
def client(stack):
    return stack.client()


@pytest.fixture
def claude(stack):
    return anthropic.Anthropic(base_url=stack.base, api_key=stack.key, max_retries=0, timeout=60)


# -- Responses ---------------------------------------------------------------------------------------
def test_a_response_answers_like_the_chat_endpoint(client):
    question = "What is the capital of France?"
    chat = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": question}], temperature=0, max_tokens=24
    )
    response = client.responses.create(model="demo", input=question, temperature=0, max_output_tokens=24)
    assert response.id.startswith("resp_") and response.object == "response" and response.status == "completed"
    assert response.output_text == chat.choices[0].message.content and "Paris" in response.output_text
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "output_text"
    usage = response.usage
    assert usage.input_tokens == chat.usage.prompt_tokens and usage.output_tokens == chat.usage.completion_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    # Input items and instructions are the same conversation.
    instructions = "You are a helpful assistant. Answer in one short sentence, and never more than that."
    expected = client.chat.completions.create(
        model="demo",
        temperature=0,
        max_tokens=24,
        messages=[{"role": "system", "content": instructions}, {"role": "user", "content": question}],
    )
    items = client.responses.create(
        model="demo",
        instructions=instructions,
        temperature=0,
        max_output_tokens=24,
        input=[{"role": "user", "content": [{"type": "input_text", "text": question}]}],
    )
    assert items.output_text == expected.choices[0].message.content and items.instructions == instructions
    # The chat request left the prompt's full blocks (16 tokens each) in the prefix cache.
    assert items.usage.input_tokens == expected.usage.prompt_tokens >= 32
    assert items.usage.input_tokens_details.cached_tokens >= 16


def test_max_output_tokens_makes_an_incomplete_response(client):
    response = client.responses.create(model="demo", input="What is Switchyard?", max_output_tokens=2, temperature=0)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 2


def test_a_function_call_and_its_output_round_trip(client):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.responses.create(
        model="demo", input=ask, tools=[WEATHER], tool_choice="required", temperature=0, max_output_tokens=64
    )
    calls = [item for item in first.output if item.type == "function_call"]
    (call,) = calls
    assert call.name == "get_weather" and call.call_id and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)
    result = {
        "type": "function_call_output",
        "call_id": call.call_id,
        "output": json.dumps({"city": "Paris", "temperature_c": 21, "condition": "sunny"}),
    }
    # The whole conversation sent again (store=False: nothing is kept) ...
    replay = [
        *ask,
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        result,
    ]
    answer = client.responses.create(
        model="demo", input=replay, tools=[WEATHER], temperature=0, max_output_tokens=48, store=False
    )
    assert answer.status == "completed" and "21" in answer.output_text and "Paris" in answer.output_text
    # The SDK's own output items passed back as input (OpenAI's documented pattern) say the same.
    echoed = client.responses.create(model="demo", input=[*ask, *first.output, result], tools=[WEATHER],
                                     temperature=0, max_output_tokens=48, store=False)  # fmt: skip
    assert echoed.output_text == answer.output_text
    # ... or continued from the stored first response: the same answer.
    continued = client.responses.create(model="demo", previous_response_id=first.id, input=[result],
                                        tools=[WEATHER], temperature=0, max_output_tokens=48)  # fmt: skip
    assert continued.output_text == answer.output_text and continued.previous_response_id == first.id


def test_streaming_events_build_the_response(client):
    kwargs = {"model": "demo", "input": "Who are you?", "temperature": 0, "max_output_tokens": 32}
    whole = client.responses.create(**kwargs)
    events = list(client.responses.create(**kwargs, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens
    # The SDK's stream helper reads the same events.
    with client.responses.stream(**kwargs) as stream:
        assert stream.get_final_response().output_text == whole.output_text


def test_a_streamed_function_call(client):
    events = list(client.responses.create(
        model="demo", input="What time is it in Tokyo?", stream=True, temperature=0, max_output_tokens=64,
        tools=[{**WEATHER, "name": "get_time", "description": "Local time in a city"}], tool_choice="required",
    ))  # fmt: skip
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    (item,) = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert item.name == "get_time" and item.arguments == done[0].arguments
    assert json.loads(item.arguments) == {"city": "Tokyo"}
    assert events[-1].response.output[-1].call_id == item.call_id


def test_previous_response_id_continues_and_store_false_keeps_nothing(stack, client):
    first = client.responses.create(model="demo", input="Say hello.", temperature=0, max_output_tokens=24)
    assert first.output_text == "Hello!"
    # Continued: the second request's prompt is the first conversation plus the new input.
    follow = "Thank you!"
    continued = client.responses.create(
        model="demo", previous_response_id=first.id, input=follow, temperature=0, max_output_tokens=24
    )
    chat = client.chat.completions.create(model="demo", temperature=0, max_tokens=24, messages=[
        {"role": "user", "content": "Say hello."}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": follow}])  # fmt: skip
    assert continued.output_text == chat.choices[0].message.content
    assert continued.usage.input_tokens == chat.usage.prompt_tokens
    # Stored: readable by its owner (any of their keys), not by anyone else's key; deleted, gone.
    assert client.responses.retrieve(first.id).output_text == first.output_text
    assert stack.client("same_owner").responses.retrieve(first.id).id == first.id
    stranger = stack.client("stranger")
    with pytest.raises(openai.NotFoundError):
        stranger.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as err:
        stranger.responses.create(model="demo", previous_response_id=first.id, input="hi")
    assert err.value.body["param"] == "previous_response_id"
    # store=False: the response has an id that cannot be continued or read.
    unstored = client.responses.create(model="demo", input="hi", store=False, max_output_tokens=4)
    assert unstored.store is False
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="demo", previous_response_id=unstored.id, input="hi")
    assert err.value.body["code"] == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    client.responses.delete(continued.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(continued.id)


def test_a_streamed_response_is_stored_before_it_completes(client):
    events = list(client.responses.create(model="demo", input="Say hello.", stream=True, max_output_tokens=8))
    rid = events[-1].response.id
    assert client.responses.retrieve(rid).output_text == events[-1].response.output_text


def test_json_schema_text_format(client):
    from workers.bench.structured import SCHEMAS

    for i, schema in enumerate(SCHEMAS[:4]):
        response = client.responses.create(
            model="demo",
            input="Answer in JSON.",
            max_output_tokens=96,
            temperature=0,
            text={"format": {"type": "json_schema", "name": f"schema_{i}", "schema": schema, "strict": True}},
        )
        assert response.status == "completed", response.output_text
        jsonschema.validate(json.loads(response.output_text), schema)
        assert response.text.format.type == "json_schema"


def test_responses_refusals_are_openai_errors(stack, client):
    for kwargs, param in [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"temperature": 3}, "temperature"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ]:
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="demo", input="hi", **kwargs)
        assert err.value.body["param"] == param, err.value.body
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="hi")
    bad_schema = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="demo", input="hi", text=bad_schema)
    assert err.value.body["param"].startswith("text.format")
    denied = httpx.post(stack.base + "/v1/responses", json={"model": "demo", "input": "hi"}, timeout=10)
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "missing_api_key"


# -- Anthropic Messages --------------------------------------------------------------------------------
def test_anthropic_messages_answer_like_the_chat_endpoint(client, claude):
    question = "What is the capital of Japan?"
    chat = client.chat.completions.create(
        model="demo",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}],
        temperature=0,
        max_tokens=24,
    )
    message = claude.messages.create(
        model="demo",
        max_tokens=24,
        system="Be brief.",
        extra_body=GREEDY,
        messages=[{"role": "user", "content": question}],
    )
    assert message.id.startswith("msg_") and message.role == "assistant" and message.stop_reason == "end_turn"
    (block,) = message.content
    assert block.type == "text" and block.text == chat.choices[0].message.content and "Tokyo" in block.text
    u = message.usage
    assert u.input_tokens + u.cache_read_input_tokens == chat.usage.prompt_tokens and u.cache_read_input_tokens > 0
    assert u.output_tokens == chat.usage.completion_tokens
    counted = claude.messages.count_tokens(
        model="demo", system="Be brief.", messages=[{"role": "user", "content": question}]
    )
    assert counted.input_tokens == chat.usage.prompt_tokens
    short = claude.messages.create(model="demo", max_tokens=2, messages=[{"role": "user", "content": question}])
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2
    stopped = claude.messages.create(
        model="demo",
        max_tokens=24,
        stop_sequences=["capital"],
        extra_body=GREEDY,
        messages=[{"role": "user", "content": question}],
    )
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "capital"
    assert stopped.content[0].text == "The "


def test_anthropic_tool_use_round_trip(claude):
    ask = {"role": "user", "content": "What is the weather in Paris?"}
    first = claude.messages.create(model="demo", max_tokens=64, extra_body=GREEDY, tools=[CLAUDE_WEATHER],
                                   tool_choice={"type": "any"}, messages=[ask])  # fmt: skip
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_") and use.input == {"city": "Paris"}
    result = {
        "type": "tool_result",
        "tool_use_id": use.id,
        "content": json.dumps({"city": "Paris", "temperature_c": 21, "condition": "sunny"}),
    }
    answer = claude.messages.create(
        model="demo",
        max_tokens=48,
        extra_body=GREEDY,
        tools=[CLAUDE_WEATHER],
        messages=[ask, {"role": "assistant", "content": first.content}, {"role": "user", "content": [result]}],
    )
    assert answer.stop_reason == "end_turn" and "21" in answer.content[0].text
    # A named tool is forced the same way.
    named = claude.messages.create(
        model="demo",
        max_tokens=64,
        extra_body=GREEDY,
        messages=[ask],
        tools=[CLAUDE_WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert [b.type for b in named.content] == ["tool_use"]


def test_anthropic_streaming(claude):
    kwargs = {
        "model": "demo",
        "max_tokens": 32,
        "extra_body": GREEDY,
        "messages": [{"role": "user", "content": "Who are you?"}],
    }
    whole = claude.messages.create(**kwargs)
    with claude.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == whole.usage.output_tokens
    raw = [e.type for e in claude.messages.create(**kwargs, stream=True)]
    assert raw[0] == "message_start" and raw[-2:] == ["message_delta", "message_stop"]
    assert raw[1] == "content_block_start" and "content_block_delta" in raw and "content_block_stop" in raw
    # A tool call streams as a tool_use block of input_json_delta.
    with claude.messages.stream(
        model="demo",
        max_tokens=64,
        extra_body=GREEDY,
        tools=[CLAUDE_WEATHER],
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)
    assert final.stop_reason == "tool_use" and final.content[-1].type == "tool_use"
    jsonschema.validate(final.content[-1].input, WEATHER_SCHEMA)


def test_anthropic_auth_and_errors(stack, claude):
    url = stack.base + "/v1/messages"
    body = {"model": "demo", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    by_header = httpx.post(
        url, json=body, headers={"x-api-key": stack.key, "anthropic-version": "2023-06-01"}, timeout=30
    )
    assert by_header.status_code == 200 and by_header.json()["type"] == "message"
    for headers, status, kind in [
        ({}, 401, "authentication_error"),
        ({"x-api-key": "sy-wrong"}, 401, "authentication_error"),
    ]:
        answer = httpx.post(url, json=body, headers=headers, timeout=10)
        assert answer.status_code == status and answer.json() == {
            "type": "error",
            "error": {"type": kind, "message": answer.json()["error"]["message"]},
        }
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=0)
    assert err.value.body["error"]["type"] == "invalid_request_error" and "max_tokens" in err.value.message
    with pytest.raises(anthropic.NotFoundError) as err:
        claude.messages.create(model="no-such-model", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(
            model="demo",
            max_tokens=8,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
        )
