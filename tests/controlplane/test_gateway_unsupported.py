"""Nothing silent at the gateway: an OpenAI parameter that is not built, or a parameter nobody
defined, is a 400 naming it, never accepted and ignored; what the official client sends is
accepted."""

import json

import httpx
import openai
import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from controlplane.gateway.core.errors import OpenAIError
from controlplane.gateway.dialects.openai.request import parse_chat, parse_completion

MSG = [{"role": "user", "content": "hi"}]
CHAT = {"model": "m", "messages": MSG}
COMPLETION = {"model": "m", "prompt": "hi"}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("parallel_tool_calls", False),
        ("service_tier", "scale"),
        ("functions", [{"name": "f", "parameters": {}}]),
        ("function_call", "auto"),
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("modalities", ["text", "audio"]),
        ("prediction", {"type": "content", "content": "x"}),
        ("web_search_options", {}),
        ("reasoning_effort", "low"),
        ("verbosity", "low"),
        ("store", True),
    ],
)
def test_chat_parameters_not_built_are_refused_naming_them(name, value):
    with pytest.raises(OpenAIError) as err:
        parse_chat({**CHAT, name: value})
    assert err.value.status == 400 and err.value.param == name and err.value.code == "unsupported"
    assert "not supported" in err.value.message


@pytest.mark.parametrize(("name", "value"), [("best_of", 3), ("echo", True), ("suffix", "end")])
def test_completion_parameters_not_built_are_refused_naming_them(name, value):
    with pytest.raises(OpenAIError) as err:
        parse_completion({**COMPLETION, name: value})
    assert err.value.param == name and err.value.code == "unsupported"


def test_prompt_cache_key_is_the_session_key_and_a_bad_one_is_refused():
    assert parse_chat({**CHAT, "prompt_cache_key": "conv-1"}).prompt_cache_key == "conv-1"
    assert parse_completion({**COMPLETION, "prompt_cache_key": None}).prompt_cache_key is None
    for value in ["", 7, "x" * 257, ["conv"]]:
        with pytest.raises(OpenAIError) as err:
            parse_chat({**CHAT, "prompt_cache_key": value})
        assert err.value.status == 400 and err.value.param == "prompt_cache_key"


def test_values_that_ask_for_nothing_unbuilt_are_accepted():
    parse_chat({**CHAT, "n": 1, "logit_bias": {}, "response_format": {"type": "text"}, "parallel_tool_calls": True,
                "service_tier": "auto", "modalities": ["text"], "store": False, "functions": [], "audio": None,
                "user": "u-1", "metadata": {"app": "x"}, "safety_identifier": "h-1"})  # fmt: skip
    parse_completion({**COMPLETION, "n": 1, "best_of": 1, "echo": False, "suffix": "", "logit_bias": None})


@pytest.mark.parametrize(
    ("parse", "body", "name"),
    [
        (parse_chat, {**CHAT, "temprature": 0.5}, "temprature"),
        (parse_chat, {**CHAT, "prompt": "hi"}, "prompt"),  # a completions parameter
        (parse_completion, {**COMPLETION, "messages": MSG}, "messages"),
        (parse_completion, {**COMPLETION, "tools": []}, "tools"),
    ],
)
def test_unknown_parameters_are_refused_naming_them(parse, body, name):
    with pytest.raises(OpenAIError) as err:
        parse(body)
    assert err.value.status == 400 and err.value.param == name and err.value.code == "unknown_parameter"
    assert name in err.value.message


def test_metadata_must_be_an_object():
    with pytest.raises(OpenAIError) as err:
        parse_chat({**CHAT, "metadata": "x"})
    assert err.value.param == "metadata" and err.value.code == "invalid_type"


def _bodies_sent_by_the_openai_client() -> list[dict]:
    """What the official client puts on the wire for ordinary calls (its defaults included)."""
    sent = []

    def capture(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(400, json={"error": {"message": "captured", "type": "x", "param": None, "code": None}})

    client = openai.OpenAI(
        base_url="http://gateway/v1",
        api_key="sy-x",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(capture)),
    )
    calls = [
        lambda: client.chat.completions.create(model="m", messages=MSG),
        lambda: client.chat.completions.create(model="m", messages=MSG, stream=True,
                                               stream_options={"include_usage": True}, temperature=0, max_tokens=8,
                                               seed=1, stop=["x"], logprobs=True, top_logprobs=2, user="u"),
        lambda: client.completions.create(model="m", prompt="hi"),
        lambda: client.completions.create(model="m", prompt="hi", stream=True, max_tokens=4, logprobs=1,
                                          extra_body={"ignore_eos": True, "top_k": 5}),
    ]  # fmt: skip
    for call in calls:
        with pytest.raises(openai.BadRequestError):
            call()
    return sent


def test_what_the_official_client_sends_is_accepted():
    chat, chat_full, completion, completion_full = _bodies_sent_by_the_openai_client()
    for body in (chat, chat_full):
        parse_chat(body)
    for body in (completion, completion_full):
        parse_completion(body)
    assert parse_chat(chat_full).params.seed == 1 and parse_completion(completion_full).params.top_k == 5


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_websocket_takes_its_session_field_and_refuses_unknown_ones(django_user_model):
    from controlplane.gateway.consumers import GenerateConsumer

    user = await sync_to_async(django_user_model.objects.create_user)("player", password="x")
    comm = WebsocketCommunicator(GenerateConsumer.as_asgi(), "/ws/generate/")
    comm.scope["user"] = user
    assert (await comm.connect(timeout=5))[0]
    # `session` is the socket's own field (the affinity key): parsing gets past it to the model lookup.
    await comm.send_json_to({"id": "a", "model": "nope", "messages": MSG, "session": "conv-1"})
    error = (await comm.receive_json_from(timeout=5))["error"]
    assert error["code"] == "model_not_found"
    await comm.send_json_to({"id": "b", "model": "nope", "messages": MSG, "n": 2})
    error = (await comm.receive_json_from(timeout=5))["error"]
    assert (error["code"], error["param"]) == ("unsupported", "n")
    await comm.disconnect()
