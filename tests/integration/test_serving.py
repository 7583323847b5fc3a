"""The serving path end to end, through real processes: uvicorn (gateway), the control Celery
worker, a node agent, and the replica process it starts with the demo model; the official
`openai` client talks to it over HTTP, a `websockets` client over the websocket."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import openai
import pytest
import redis
from django.conf import settings
from websockets.sync.client import connect as ws_connect

from tests.support.platform import DEMO, DEMO_PD, platform
from tests.support.stack import metric, replica_load, replica_status, wait_for
from workers.demo import MODEL_DIR
from workers.protocol import replica as protocol

# django_db: so that the test database exists even when this module runs alone; the stack's
# rows are committed by the module fixture (outside each test's transaction) and flushed after.
pytestmark = [pytest.mark.timeout(240), pytest.mark.django_db]


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory):
    """A running platform with the `demo` deployment ready, and API keys to call it."""
    env = {"REPLICA_MAX_RESTARTS": "3", "PD_LOCAL_PREFILL_TOKENS": "0"}
    deployments = [DEMO, {"slug": "other", "replicas": 0}, DEMO_PD]
    keys = {
        "key": {},
        "limited": {"allowed_deployments": ["other"]},
        "slow": {"rpm_limit": 1},
        "thrifty": {"tpm_limit": 20},
    }
    with platform(django_db_blocker, tmp_path_factory, "serving", deployments=deployments, keys=keys, env=env,
                  staff=True, session=True) as p:  # fmt: skip
        yield p


@pytest.fixture(scope="module")
def llm():
    from workers.engine import LLM

    return LLM(model=str(MODEL_DIR), device="cpu", dtype="float32")


@pytest.fixture
def client(stack):
    return stack.client()


QUESTION = [{"role": "user", "content": "What is the capital of Japan?"}]


def test_models_lists_the_deployments_the_key_may_use(client, stack):
    assert {m.id for m in client.models.list().data} == {"demo", "demo-pd", "other"}
    limited = openai.OpenAI(base_url=stack.base + "/v1", api_key=stack.keys["limited"], max_retries=0)
    assert [m.id for m in limited.models.list().data] == ["other"]


def test_replica_reported_its_loading_and_load(stack):
    from controlplane.deployments.models import Replica

    replica = Replica.objects.get(pk=stack.replica("demo").pk)
    assert replica.progress == {"stage": "loaded", "fraction": 1.0}
    assert replica.endpoint["stream"] == protocol.requests_key(replica.pk)
    load = replica_load(replica.pk)
    assert {"running", "waiting", "kv_blocks_total", "kv_blocks_free", "tokens_per_second"} <= set(load)
    assert load["kv_blocks_total"] >= load["kv_blocks_free"] > 0


def test_metrics_parse_as_prometheus_text_and_move_when_a_request_is_served(client, stack):
    replica = str(stack.replica("demo").pk)

    def sample(name: str) -> float:
        return metric(stack.base, name, replica=replica)

    before_tokens = sample("switchyard_generation_tokens_total")
    before_requests = sample("switchyard_requests_total")
    before_ttft = sample("switchyard_time_to_first_token_seconds_count")
    done = client.chat.completions.create(model="demo", messages=QUESTION, temperature=0, max_tokens=5)
    wait_for(
        lambda: sample("switchyard_generation_tokens_total") >= before_tokens + done.usage.completion_tokens,
        5,
        "the token counter to move",
    )
    assert sample("switchyard_requests_total") >= before_requests + 1
    assert sample("switchyard_time_to_first_token_seconds_count") >= before_ttft + 1
    assert sample("switchyard_replica_up") == 1
    assert sample("switchyard_kv_blocks") > 0


def test_metric_history_points_follow_the_traffic(client, stack, staff_client):
    from controlplane.common import redis as redis_client
    from controlplane.telemetry.history import history, sample

    sample(redis_client.client())
    client.chat.completions.create(model="demo", messages=QUESTION, temperature=0, max_tokens=8)

    # A heartbeat between the first token and the rest gives a point with tokens/s and no
    # inter-token latency yet (one token, no gap): wait for the point that has both.
    def traffic_point():
        point = sample(redis_client.client())["demo"]
        return point["tokens_per_second"] and point["itl_p50_ms"] is not None

    wait_for(traffic_point, 5, "a point with tokens/s and inter-token latency")
    points = history(redis_client.client(), "demo")
    last = points[-1]
    assert len(points) >= 2 and last["replicas_up"] == 1 and last["tokens_per_second"] > 0
    assert last["itl_p50_ms"] is not None and last["kv_use"] is not None
    body = staff_client.get("/api/v1/telemetry/history/?deployment=demo&seconds=60").json()
    assert body["deployment"] == "demo" and body["points"][-1]["t"] == last["t"]
    assert staff_client.get("/api/v1/telemetry/history/?deployment=nope").status_code == 404


def test_a_session_is_bound_to_its_replica_and_its_next_turn_follows_the_binding(client, stack):
    from controlplane.gateway.routing.router import affinity_key

    first = client.chat.completions.with_raw_response.create(
        model="demo", messages=QUESTION, max_tokens=2, extra_headers={"x-session-affinity": "conv-42"}
    )
    stored = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True).get(affinity_key("demo", "conv-42"))
    assert stored == first.headers["x-switchyard-replica"]
    again = client.chat.completions.with_raw_response.create(
        model="demo", messages=QUESTION, max_tokens=2, extra_headers={"x-session-affinity": "conv-42"}
    )
    assert again.headers["x-switchyard-route-reason"] == "session_bound"
    assert again.headers["x-switchyard-replica"] == stored


def test_chat_completion_matches_the_engine_token_for_token(client, llm):
    from workers.engine import SamplingParams

    response = client.chat.completions.with_raw_response.create(
        model="demo", messages=QUESTION, temperature=0, max_tokens=24
    )
    assert response.headers["x-switchyard-replica"].isdigit()
    assert response.headers["x-switchyard-route-reason"] == "only_ready_replica"
    chat = response.parse()
    expected = llm.chat(QUESTION, SamplingParams(temperature=0.0, max_tokens=24))[0]
    assert chat.choices[0].message.content == expected.outputs[0].text
    assert "Tokyo" in chat.choices[0].message.content  # the demo model answers
    assert chat.choices[0].finish_reason == "stop"
    assert chat.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert chat.usage.completion_tokens == len(expected.outputs[0].token_ids)
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens


def test_disaggregated_deployment_streams_the_same_completion(client):
    from controlplane.deployments.models import Replica

    roles = dict(Replica.objects.filter(deployment__slug="demo-pd", state="ready").values_list("role", "id"))
    prompt = "<|user|>What is the capital of Peru?<|end|>\n<|assistant|>"
    whole = client.completions.create(model="demo", prompt=prompt, temperature=0, max_tokens=12)
    raw = client.completions.with_raw_response.create(
        model="demo-pd", prompt=prompt, temperature=0, max_tokens=12, stream=True
    )
    assert raw.headers["x-switchyard-prefill-replica"] == str(roles["prefill"])
    assert raw.headers["x-switchyard-replica"] == str(roles["decode"])
    assert raw.headers["x-switchyard-route-reason"] == "only_ready_replica;prefill_least_tokens"
    text = "".join(chunk.choices[0].text for chunk in raw.parse() if chunk.choices)
    assert text == whole.choices[0].text and "Lima" in text
    wait_for(lambda: replica_load(roles["decode"])["kv_transfer"]["handoffs"] >= 1, 5, "the handoff to be counted")
    assert replica_load(roles["decode"])["kv_transfer"]["fallbacks"] == 0


def test_streamed_chat_equals_the_whole_one_and_reports_usage(client):
    whole = client.chat.completions.create(model="demo", messages=QUESTION, temperature=0, max_tokens=24)
    chunks = list(
        client.chat.completions.create(
            model="demo",
            messages=QUESTION,
            temperature=0,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_a_repeated_prompt_reports_cached_tokens(client):
    from workers.demo.corpus import tool_schemas

    # The tools list makes the prompt span several KV blocks (16 tokens each).
    usages = [
        client.chat.completions.create(
            model="demo", messages=QUESTION, tools=tool_schemas(), temperature=0, max_tokens=4
        ).usage
        for _ in range(2)
    ]
    assert usages[0].prompt_tokens > 32
    assert usages[1].prompt_tokens_details.cached_tokens >= 32
    assert usages[1].prompt_tokens_details.cached_tokens < usages[1].prompt_tokens


def test_completion_matches_the_engine_with_logprobs(client, llm):
    from workers.engine import SamplingParams

    prompt = "<|user|>What is the capital of Peru?<|end|>\n<|assistant|>"
    done = client.completions.create(model="demo", prompt=prompt, temperature=0, max_tokens=12, logprobs=2)
    expected = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12, logprobs=2))[0].outputs[0]
    assert done.choices[0].text == expected.text
    assert "Lima" in done.choices[0].text
    lp = done.choices[0].logprobs
    assert len(lp.token_logprobs) == len(expected.token_ids) == done.usage.completion_tokens
    for got, want, token in zip(lp.token_logprobs, expected.logprobs, expected.token_ids, strict=True):
        assert got == pytest.approx(want[token], abs=1e-4)
    assert all(len(top) == 2 for top in lp.top_logprobs)


def test_tool_call_comes_back_as_tool_calls(client):
    from workers.demo.corpus import tool_schemas

    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    chat = client.chat.completions.create(model="demo", messages=messages, tools=tool_schemas(), temperature=0)
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    stream = client.chat.completions.create(
        model="demo", messages=messages, tools=tool_schemas(), temperature=0, stream=True
    )
    deltas = [c.choices[0].delta for c in stream if c.choices]
    streamed = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert [(tc.index, tc.function.name, json.loads(tc.function.arguments)) for tc in streamed] == [
        (0, "get_weather", {"city": "Paris"})
    ]
    assert not "".join(d.content or "" for d in deltas).strip()


def test_websocket_streams_the_same_tokens_as_sse(client, stack):
    sse_text = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model="demo", messages=QUESTION, temperature=0, max_tokens=24, stream=True
        )
        if c.choices
    )
    url = f"ws://127.0.0.1:{stack.port}/ws/generate/?api_key={stack.key}"
    with ws_connect(url, origin=stack.base, open_timeout=10) as ws:
        for rid in ("a", "b"):  # two requests at once on one socket
            ws.send(json.dumps({"id": rid, "model": "demo", "messages": QUESTION, "temperature": 0, "max_tokens": 24}))
        texts, done = {"a": "", "b": ""}, {}
        while len(done) < 2:
            event = json.loads(ws.recv(timeout=30))
            assert event["type"] in ("start", "token", "done"), event
            if event["type"] == "token":
                texts[event["id"]] += event["text"]
            elif event["type"] == "done":
                done[event["id"]] = event
    assert texts == {"a": sse_text, "b": sse_text}
    assert done["a"]["finish_reason"] == "stop" and done["a"]["usage"]["completion_tokens"] > 0
    assert done["a"]["timings"]["ttft_ms"] > 0

    # The console signs in with its session instead of a key.
    cookie = {"Cookie": f"sessionid={stack.session}"}
    with ws_connect(f"ws://127.0.0.1:{stack.port}/ws/generate/", origin=stack.base, additional_headers=cookie) as ws:
        ws.send(json.dumps({"id": "s", "model": "demo", "messages": QUESTION, "temperature": 0, "max_tokens": 24}))
        text = ""
        while (event := json.loads(ws.recv(timeout=30)))["type"] != "done":
            text += event.get("text", "")
    assert text == sse_text


def test_websocket_takes_a_key_without_origin_and_says_why_it_refuses(stack):
    from websockets.exceptions import ConnectionClosed

    # An application: no Origin header, the key in the Authorization header.
    auth = {"Authorization": f"Bearer {stack.key}"}
    with ws_connect(f"ws://127.0.0.1:{stack.port}/ws/generate/", additional_headers=auth, open_timeout=10) as ws:
        ws.send(json.dumps({"id": "k", "model": "demo", "messages": QUESTION, "temperature": 0, "max_tokens": 4}))
        while (event := json.loads(ws.recv(timeout=30)))["type"] != "done":
            assert event["type"] in ("start", "token"), event
    # No key or a wrong one: accepted, then closed with 4401 and the reason (not a bare 403).
    for query, reason in (("", "No API key"), ("?api_key=sy-wrong", "Invalid or revoked API key")):
        url = f"ws://127.0.0.1:{stack.port}/ws/generate/{query}"
        with ws_connect(url, open_timeout=10) as ws, pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd.code == 4401 and reason in closed.value.rcvd.reason


def _post(stack, path, body, key="default", **kwargs):
    headers = {} if key is None else {"Authorization": f"Bearer {stack.key if key == 'default' else key}"}
    return httpx.post(
        stack.base + path,
        content=body if isinstance(body, bytes) else json.dumps(body),
        headers={**headers, "Content-Type": "application/json"},
        timeout=30,
        **kwargs,
    )


def _error(response) -> dict:
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def test_bad_input_gets_openai_errors_never_500(stack):
    ok = {"model": "demo", "messages": QUESTION, "max_tokens": 2}
    r = _post(stack, "/v1/chat/completions", b"{not json")
    assert r.status_code == 400 and _error(r)["code"] == "invalid_json"
    r = _post(stack, "/v1/chat/completions", {**ok, "temperature": "hot"})
    assert r.status_code == 400 and _error(r)["param"] == "temperature"
    r = _post(stack, "/v1/chat/completions", {**ok, "messages": [{"role": "wizard", "content": "hi"}]})
    assert r.status_code == 400 and _error(r)["param"] == "messages[0].role"
    r = _post(stack, "/v1/chat/completions", {**ok, "max_tokens": 0})
    assert r.status_code == 400 and _error(r)["param"] == "max_tokens"
    r = _post(stack, "/v1/chat/completions", {**ok, "model": "nope"})
    assert r.status_code == 404 and _error(r)["code"] == "model_not_found"
    r = _post(stack, "/v1/chat/completions", ok, key=None)
    assert r.status_code == 401 and _error(r)["type"] == "authentication_error"
    r = _post(stack, "/v1/chat/completions", ok, key="sy-not-a-real-key")
    assert r.status_code == 401
    r = _post(stack, "/v1/chat/completions", ok, key=stack.keys["limited"])
    assert r.status_code == 403 and _error(r)["code"] == "model_not_allowed"
    long_prompt = {**ok, "messages": [{"role": "user", "content": "hello " * 700}]}
    for stream in (False, True):
        r = _post(stack, "/v1/chat/completions", {**long_prompt, "stream": stream})
        assert r.status_code == 400 and _error(r)["code"] == "context_length_exceeded"
        assert "context" in _error(r)["message"] and _error(r)["param"] == "messages"
    r = httpx.get(stack.base + "/v1/chat/completions", headers={"Authorization": f"Bearer {stack.key}"})
    assert r.status_code == 405
    r = _post(stack, "/v1/completions", {"model": "demo", "prompt": "hi", "n": 17})
    assert r.status_code == 400 and _error(r)["param"] == "n" and "at most 16" in _error(r)["message"]
    # Through uvicorn too: deep nesting, NaN and a huge seed are 400s, a big body a 413.
    r = _post(stack, "/v1/chat/completions", b"[" * 100_000 + b"]" * 100_000)
    assert r.status_code == 400 and _error(r)["code"] == "invalid_json"
    r = _post(stack, "/v1/chat/completions", json.dumps({**ok, "temperature": float("nan")}).encode())
    assert r.status_code == 400 and _error(r)["param"] == "temperature"
    r = _post(stack, "/v1/chat/completions", {**ok, "seed": 2**64})
    assert r.status_code == 400 and _error(r)["param"] == "seed"
    r = _post(stack, "/v1/chat/completions", b" " * (settings.MAX_REQUEST_BYTES + 1))
    assert r.status_code == 413 and _error(r)["code"] == "request_too_large"


def test_rate_limit_answers_429_with_retry_after(stack):
    ok = {"model": "demo", "messages": QUESTION, "max_tokens": 2}
    # Limits count per wall-clock minute: keep both requests of a pair inside one.
    wait_for(lambda: time.time() % 60 < 50, 15, "the start of a rate-limit minute", interval=0.5)
    assert _post(stack, "/v1/chat/completions", ok, key=stack.keys["slow"]).status_code == 200
    r = _post(stack, "/v1/chat/completions", ok, key=stack.keys["slow"])
    assert r.status_code == 429 and _error(r)["type"] == "rate_limit_error"
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    # Tokens per minute (20): a prompt larger than the whole budget is refused before it runs,
    # with no Retry-After (waiting would not help)...
    huge = {**ok, "messages": [{"role": "user", "content": "Tell me about " + "the sea and " * 10}]}
    r = _post(stack, "/v1/chat/completions", huge, key=stack.keys["thrifty"])
    assert r.status_code == 429 and "too large" in _error(r)["message"] and "Retry-After" not in r.headers
    # ...the first request (11 prompt + 2 completion tokens) passes; the second's 11 prompt tokens
    # would take the minute's 13 past 20.
    assert _post(stack, "/v1/chat/completions", ok, key=stack.keys["thrifty"]).status_code == 200
    r = _post(stack, "/v1/chat/completions", ok, key=stack.keys["thrifty"])
    assert r.status_code == 429 and "tokens" in _error(r)["message"] and "Retry-After" in r.headers


def test_client_disconnect_aborts_the_request_in_the_replica(stack):
    replica = stack.replica("demo")
    body = {"model": "demo", "prompt": "Hello", "max_tokens": 400, "ignore_eos": True, "stream": True}
    headers = {"Authorization": f"Bearer {stack.key}"}
    with httpx.stream("POST", stack.base + "/v1/completions", json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200
        request_id = r.headers["x-request-id"]
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        closed_at = time.monotonic()
    log = stack.state / "logs" / f"replica-{replica.pk}.log"
    wait_for(lambda: f"aborted {request_id}" in log.read_text(), 5, "the replica to abort the request")
    assert time.monotonic() - closed_at < 2.0  # the issue asks for "within a second"; 1 s of slack
    wait_for(lambda: replica_load(replica.pk).get("running") == 0, 5, "the slot to be freed")


def test_killing_the_replica_mid_stream_ends_the_stream_with_an_error_and_it_restarts(client, stack):
    replica = stack.replica("demo")
    pid = json.loads(replica_status(replica.pk)["endpoint"])["pid"]
    stream = client.completions.create(
        model="demo", prompt="Hello", max_tokens=400, stream=True, extra_body={"ignore_eos": True}
    )
    received = 0
    started = time.monotonic()
    with pytest.raises(openai.APIError) as failed:
        for _ in stream:
            received += 1
            if received == 2:
                os.kill(pid, signal.SIGKILL)
    assert received >= 2
    assert "replica" in str(failed.value.message)
    assert time.monotonic() - started < 15
    # The agent restarts it; the deployment serves again.
    from controlplane.deployments.models import Replica

    wait_for(
        lambda: Replica.objects.filter(pk=replica.pk, state="ready", restart_count=1).exclude(pid=pid).exists(),
        60,
        "the replica to be restarted",
    )
    again = client.chat.completions.create(model="demo", messages=QUESTION, temperature=0, max_tokens=8)
    assert again.choices[0].message.content
