"""Bad input on every surface gets a clear 4xx in that surface's error shape, never a 500, an
HTML page or a traceback: the OpenAI API (/v1), the management API (/api/v1), the generate
websocket, and the ASGI handlers in front of them (body size)."""

import json

import httpx
import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings

from controlplane.config.asgi import application
from controlplane.gateway.consumers import GenerateConsumer
from controlplane.gateway.core.body import parse_json
from controlplane.gateway.core.errors import OpenAIError
from controlplane.gateway.dialects.openai.request import parse_chat, parse_completion
from controlplane.gateway.generation import _refusal
from controlplane.gateway.services import create_api_key
from workers.protocol.replica import ErrorEvent

MSG = [{"role": "user", "content": "hi"}]
DEEP = b"[" * 100_000 + b"]" * 100_000  # past Python's recursion limit, not only ours


def chat(**fields) -> dict:
    return {"model": "m", "messages": MSG, **fields}


# -- parameters at the gateway ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"seed": 2**64}, "seed"),
        ({"seed": -1}, "seed"),
        ({"seed": 10**40}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"top_k": 2**31}, "top_k"),
        ({"top_k": -2}, "top_k"),
        ({"max_tokens": 2**31}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": float("inf")}, "top_p"),
        ({"presence_penalty": -float("inf")}, "presence_penalty"),
        ({"repetition_penalty": 10**400}, "repetition_penalty"),
        ({"min_p": "0.5"}, "min_p"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"logprobs": 1}, "logprobs"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
        ({"messages": [{"role": "tool", "content": "x", "tool_call_id": 7}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"function": "f"}]}]}, "messages[0].tool_calls"),
    ],
)
def test_chat_parameters_out_of_range_are_400s_naming_them(fields, param):
    with pytest.raises(OpenAIError) as err:
        parse_chat(chat(**fields))
    assert (err.value.status, err.value.param) == (400, param)
    assert err.value.code in ("invalid_value", "invalid_type")
    assert len(err.value.message) < 200  # a huge value is not echoed back whole


def test_the_widest_seed_and_token_ids_pass():
    assert parse_chat(chat(seed=2**64 - 1)).params.seed == 2**64 - 1
    assert parse_completion({"model": "m", "prompt": [0, 2**31 - 1]}).prompt_token_ids == [0, 2**31 - 1]


@pytest.mark.parametrize("prompt", [[-1], [2**31], [1, 2**64]])
def test_completion_token_ids_out_of_range_are_400s(prompt):
    with pytest.raises(OpenAIError) as err:
        parse_completion({"model": "m", "prompt": prompt})
    assert (err.value.status, err.value.param) == (400, "prompt")


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"model": "m", "messages": [], "temperature": NaN}', "temperature"),
        (b'{"model": "m", "messages": [], "top_p": Infinity}', "top_p"),
        (b'{"model": "m", "messages": [], "presence_penalty": -Infinity}', "presence_penalty"),
        (b'{"model": "m", "messages": [], "temperature": 1e999}', "temperature"),  # inf to Python
        (b'{"model": "m", "messages": [{"role": "user", "content": [NaN]}]}', "messages[0].content[0]"),
    ],
)
def test_non_finite_numbers_are_refused_at_parse_time_naming_where(raw, param):
    with pytest.raises(OpenAIError) as err:
        parse_json(raw)
    assert (err.value.status, err.value.param, err.value.code) == (400, param, "invalid_value")


def test_depth_limit_and_unreadable_numbers_are_400s():
    at_limit = {"model": "m", "x": None}
    inner = at_limit
    for _ in range(settings.MAX_JSON_DEPTH - 2):
        inner["x"] = {"x": None}
        inner = inner["x"]
    assert parse_json(json.dumps(at_limit).encode())["model"] == "m"
    inner["x"] = {"x": [1]}  # one level more
    for raw in (json.dumps(at_limit).encode(), DEEP, b'{"seed": ' + b"9" * 5000 + b"}", b'{"a": "\xff"}'):
        with pytest.raises(OpenAIError) as err:
            parse_json(raw)
        assert (err.value.status, err.value.code) == (400, "invalid_json")
        assert "Traceback" not in err.value.message and "sys.set_int_max_str_digits" not in err.value.message


def test_a_body_over_the_limit_is_413_request_too_large(settings):
    settings.MAX_REQUEST_BYTES = 100
    with pytest.raises(OpenAIError) as err:
        parse_json(json.dumps(chat(pad="x" * 100)).encode())
    assert (err.value.status, err.value.code) == (413, "request_too_large")


# -- the replica's refusals, as the client sees them --------------------------------------------
def test_a_replica_refusal_names_its_parameter_and_never_blames_messages_by_default():
    req = parse_chat(chat())
    seed = _refusal(req, ErrorEvent("r", 400, "seed must be in [0, 2**64-1]", "seed", "invalid_value"))
    assert (seed.status, seed.param, seed.code) == (400, "seed", "invalid_value")
    unnamed = _refusal(req, ErrorEvent("r", 400, "request id 'x' is already in use"))
    assert unnamed.param is None
    context = _refusal(req, ErrorEvent("r", 400, "too long", code="context_length_exceeded"))
    assert context.param == "messages"
    crashed = _refusal(req, ErrorEvent("r", 500, "KeyError: 'logits' at model_runner.py:88"))
    assert (crashed.status, crashed.code) == (502, "replica_error")
    assert "KeyError" not in crashed.message and "model_runner" not in crashed.message


# -- /v1 over HTTP --------------------------------------------------------------------------------
@pytest.fixture
def api_key(db, django_user_model) -> str:
    return create_api_key(name="bad-input", owner=django_user_model.objects.create_user("key-owner"))[1]


def post_v1(client, api_key, raw: bytes, path="/v1/chat/completions"):
    return client.post(path, raw, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {api_key}")


def assert_openai_error(response, status: int, code: str, param=None) -> None:
    assert response.status_code == status and response["Content-Type"] == "application/json", response.content[:200]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"]) == (code, param)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_v1_deep_nesting_is_a_json_400_not_an_html_500(client, api_key, path):
    assert_openai_error(post_v1(client, api_key, DEEP, path), 400, "invalid_json")


def test_v1_nan_is_a_400_naming_the_parameter(client, api_key):
    raw = b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    assert_openai_error(post_v1(client, api_key, raw), 400, "invalid_value", "temperature")


def test_v1_body_over_the_default_limit_is_a_json_413(client, api_key):
    raw = json.dumps(chat(pad="x" * settings.MAX_REQUEST_BYTES)).encode()
    assert_openai_error(post_v1(client, api_key, raw), 413, "request_too_large")


def test_v1_huge_seed_is_a_400_before_any_replica_is_involved(client, api_key):
    raw = json.dumps(chat(model="no-such-deployment", seed=18446744073709551616)).encode()
    assert_openai_error(post_v1(client, api_key, raw), 400, "invalid_value", "seed")


@pytest.mark.parametrize(
    "body", [chat(model="a\u0000b"), {"model": "\u0000", "prompt": "hi"}], ids=["chat", "completion"]
)
def test_v1_a_model_name_with_a_nul_is_no_such_model(client, api_key, body):
    """Not a slug, so no deployment's name: a 404, not the database refusing the lookup (a 500)."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    assert_openai_error(post_v1(client, api_key, json.dumps(body).encode(), path), 404, "model_not_found", "model")
    response = client.get("/v1/models/a%00b", HTTP_AUTHORIZATION=f"Bearer {api_key}")
    assert_openai_error(response, 404, "model_not_found", "model")


# -- /api/v1 (DRF) ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "data"),
    [
        ("get", "/api/v1/deployments/a%00b/", None),  # a slug lookup from the path
        ("get", "/api/v1/telemetry/history/?deployment=a%00b", None),  # from the query
        ("post", "/api/v1/deployments/", {"slug": "d", "model": "a\x00b"}),  # a related slug, from a form
    ],
)
def test_api_a_nul_the_database_refuses_is_a_drf_400(staff_client, method, path, data):
    response = getattr(staff_client, method)(path, data)
    assert response.status_code == 400 and "database refuses" in response.json()["detail"], response.content


def test_api_deep_nesting_is_a_drf_400(staff_client):
    response = staff_client.post("/api/v1/cache-policies/", DEEP, content_type="application/json")
    assert response.status_code == 400
    assert "nests deeper" in response.json()["detail"]


def test_api_nan_is_a_drf_400_naming_the_field(staff_client):
    raw = b'{"name": "p", "session_affinity_ttl_seconds": NaN}'
    response = staff_client.post("/api/v1/cache-policies/", raw, content_type="application/json")
    assert response.status_code == 400
    assert "finite" in response.json()["session_affinity_ttl_seconds"][0]


@pytest.mark.parametrize("fmt", ["json", "multipart"])
def test_api_body_over_the_limit_is_a_drf_413(staff_client, fmt):
    body = {"name": "x" * (settings.MAX_REQUEST_BYTES + 1)}
    response = staff_client.post("/api/v1/cache-policies/", body, format=fmt)
    assert response.status_code == 413
    assert "limited to" in response.json()["detail"]


# -- the ASGI handlers: refused while the body arrives ------------------------------------------
async def asgi_post(path: str, content, headers=None) -> httpx.Response:
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        return await http.post(path, content=content, headers=headers or {})


@pytest.mark.asyncio
@pytest.mark.parametrize(("path", "shape"), [("/v1/chat/completions", "openai"), ("/api/v1/cache-policies/", "drf")])
async def test_asgi_refuses_a_declared_length_over_the_limit_in_each_surfaces_shape(settings, path, shape):
    settings.MAX_REQUEST_BYTES = 1000
    response = await asgi_post(path, b"{" + b" " * 2000 + b"}", {"content-type": "application/json"})
    assert response.status_code == 413
    body = response.json()
    if shape == "openai":
        assert body["error"]["code"] == "request_too_large" and body["error"]["type"] == "invalid_request_error"
    else:
        assert "limited to 1000 bytes" in body["detail"]


@pytest.mark.asyncio
async def test_asgi_stops_reading_a_chunked_body_once_past_the_limit(settings):
    settings.MAX_REQUEST_BYTES = 10_000
    pulled = 0

    async def chunks():  # 100 x 1000 bytes, no Content-Length
        nonlocal pulled
        for _ in range(100):
            pulled += 1
            yield b" " * 1000

    response = await asgi_post("/v1/chat/completions", chunks(), {"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    assert pulled <= 12  # the rest was never read, let alone stored


# -- the generate websocket -----------------------------------------------------------------------
async def generate_socket(django_user_model) -> WebsocketCommunicator:
    user = await sync_to_async(django_user_model.objects.create_user)("ws-user", password="x")
    comm = WebsocketCommunicator(GenerateConsumer.as_asgi(), "/ws/generate/")
    comm.scope["user"] = user
    connected, _ = await comm.connect(timeout=5)
    assert connected
    return comm


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_websocket_bad_frames_get_errors_and_the_socket_goes_on(django_user_model):
    comm = await generate_socket(django_user_model)
    for frame, code, param in [
        ({"text_data": DEEP.decode()}, "invalid_json", None),
        ({"text_data": "{not json"}, "invalid_json", None),
        ({"bytes_data": b"\x00\x01"}, "invalid_json", None),
        (
            {"text_data": '{"id": "r0", "model": "m", "messages": [], "temperature": NaN}'},
            "invalid_value",
            "temperature",
        ),
    ]:
        await comm.send_to(**frame)
        reply = await comm.receive_json_from(timeout=5)
        assert reply["type"] == "error" and reply["id"] is None
        assert (reply["error"]["code"], reply["error"]["param"]) == (code, param)
    # Same validation as the HTTP API, with the request's id.
    await comm.send_json_to({"id": "r1", **chat(seed=2**64)})
    reply = await comm.receive_json_from(timeout=5)
    assert (reply["id"], reply["error"]["param"]) == ("r1", "seed")
    await comm.send_json_to({"id": "r2", **chat(session=["not", "a", "string"])})
    reply = await comm.receive_json_from(timeout=5)
    assert (reply["id"], reply["error"]["param"]) == ("r2", "session")
    # And the socket still serves requests: this one reaches the deployment lookup.
    await comm.send_json_to({"id": "r3", **chat(model="nope")})
    reply = await comm.receive_json_from(timeout=5)
    assert (reply["id"], reply["error"]["code"]) == ("r3", "model_not_found")
    await comm.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_websocket_frame_over_the_limit_is_413(django_user_model, settings):
    settings.MAX_REQUEST_BYTES = 1000
    comm = await generate_socket(django_user_model)
    await comm.send_json_to({"id": "big", **chat(pad="x" * 2000)})
    reply = await comm.receive_json_from(timeout=5)
    assert reply["error"]["code"] == "request_too_large"
    await comm.disconnect()
