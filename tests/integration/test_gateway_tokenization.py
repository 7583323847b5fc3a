"""The gateway's token ids are the replica's: real replica processes (the demo model, and a tiny
Mistral checkpoint with a sliding window and a Qwen2.5-style chat template that renders tools and
tool calls) are sent requests as the gateway sent them before it tokenised (chat messages with
their tools, text) and return the ids they computed; the gateway's `tokenization.prompt_ids`
must give the same. The context the gateway refuses by is the one the replica's engine serves,
and both refuse the same prompts."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace

import pytest
import redis
from asgiref.sync import async_to_sync
from django.conf import settings

from controlplane.catalog.models import Model
from controlplane.deployments.models import Deployment
from controlplane.gateway import tokenization
from controlplane.gateway.core.errors import OpenAIError
from controlplane.gateway.dialects.openai.request import parse_chat, parse_completion
from tests.engine.checkpoints import build_checkpoint
from tests.support.stack import wait_for
from workers.bench.processes import start_replica
from workers.demo import MODEL_DIR
from workers.demo.corpus import tool_schemas
from workers.protocol import replica as protocol
from workers.protocol.replica import GenerateMessage, ReplicaSpec, WireSamplingParams, read_event

pytestmark = pytest.mark.timeout(240)

# Qwen2.5's template, as its tokenizer_config.json ships it (tools in the system turn, calls and
# tool responses in XML tags, arguments through tojson).
QWEN_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""  # noqa: E501

TOOLS = tool_schemas()[:3]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Lima"})},
}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the weather in Lima? Naïve café 東京 🚀"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 19}'},
    {"role": "user", "content": "And tomorrow?"},
]
BODIES = [
    {"messages": CONVERSATION, "tools": TOOLS},
    {"messages": CONVERSATION[1:2], "tools": TOOLS},
    {"messages": CONVERSATION[1:2], "tools": TOOLS, "tool_choice": "none"},
    {"messages": CONVERSATION[:2]},
    {"prompt": "The quick brown fox jumps over the lazy dog."},
]
# (replica id, the spec's max_model_len, the context the engine then serves)
DEMO = (9311, 400, 400)  # the demo model has 512 positions
QWEN = (9312, None, 2048)  # the sliding window, under 4096 positions


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    directory = build_checkpoint(
        tmp_path_factory.mktemp("qwen-tools"), "mistral", max_position_embeddings=4096, sliding_window=2048
    )
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": QWEN_TEMPLATE}))
    return directory


@pytest.fixture(scope="module")
def replicas(qwen_dir, tmp_path_factory):
    """A real replica per model, each ready: {replica id: model directory}."""
    state = tmp_path_factory.mktemp("gateway-tokens")
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    models = {DEMO[0]: (MODEL_DIR, DEMO[1]), QWEN[0]: (qwen_dir, QWEN[1])}
    started = []
    try:
        for rid, (directory, max_len) in models.items():
            client.delete(protocol.status_key(rid), protocol.requests_key(rid))
            spec = ReplicaSpec(replica_id=rid, deployment="tokens", model_dir=str(directory), model_name="m",
                               dtype="float32", block_size=16, threads=1, redis_url=settings.REDIS_URL,
                               kv_cache_bytes=16 << 20, max_model_len=max_len)  # fmt: skip
            started.append(start_replica(spec, state))
        for rid in models:
            wait_for(lambda rid=rid: client.hget(protocol.status_key(rid), "state") == "ready", 90, f"replica {rid}")
        yield {rid: directory for rid, (directory, _) in models.items()}
    finally:
        for process, log in started:
            process.kill()
            process.wait()
            log.close()


def deployment_of(directory, max_model_len: int | None) -> Deployment:
    return Deployment(slug="tokens", model=Model(name="m", source=str(directory)), max_model_len=max_model_len)


def ask(replica_id: int, message: GenerateMessage) -> dict:
    """Send `message` to the replica as the gateway does; its first event (accepted or error)."""
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    channel, rid = f"tokens-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel)
    sent = replace(message, id=rid, reply_to=channel)
    client.xadd(protocol.requests_key(replica_id), {"m": protocol.encode(sent.to_wire())})
    first = wait_for(lambda: pubsub.get_message(timeout=0.5), 60, f"an answer from replica {replica_id}")
    pubsub.close()
    return read_event(json.loads(first["data"])).to_wire()


def request(body: dict):
    full = {"model": "tokens", "max_tokens": 1, **body}
    return parse_chat(full) if "messages" in body else parse_completion(full)


@pytest.mark.parametrize("which", [DEMO, QWEN], ids=["demo", "qwen-tools"])
def test_the_gateway_tokenises_as_the_replica_does(replicas, which):
    rid, max_len, _ = which
    deployment = deployment_of(replicas[rid], max_len)
    for body in BODIES:
        req = request(body)
        before = req.replica_message()  # what the gateway sent before it tokenised: the replica renders
        assert (before.messages is not None) == ("messages" in body)
        before.return_prompt_token_ids = True
        accepted = ask(rid, before)
        assert accepted["type"] == "accepted", accepted
        ids = tokenization.prompt_ids(deployment, req)
        assert ids == accepted["prompt_token_ids"], body
        # And what it sends now: the ids alone, which the replica takes as they are.
        async_to_sync(tokenization.tokenize)(deployment, req)
        now = req.replica_message()
        assert (now.prompt_token_ids, now.messages, now.tools) == (ids, None, None)
        assert ask(rid, now)["prompt_tokens"] == len(ids)


@pytest.mark.parametrize("which", [DEMO, QWEN], ids=["demo", "qwen-tools"])
def test_the_gateway_refuses_the_prompts_the_engine_refuses(replicas, which):
    rid, max_len, served = which
    deployment = deployment_of(replicas[rid], max_len)
    endpoint = json.loads(redis.Redis.from_url(settings.REDIS_URL).hget(protocol.status_key(rid), "endpoint"))
    assert tokenization.context_length(deployment) == endpoint["max_model_len"] == served
    params = WireSamplingParams(max_tokens=10**6)  # past the room left: cut short, not refused
    for length in (served - 1, served):
        ids = [5 + i % 300 for i in range(length)]  # within both vocabularies
        replica = ask(rid, GenerateMessage(params=params, prompt_token_ids=ids))
        req = request({"prompt": ids, "max_tokens": 10**6})
        try:
            async_to_sync(tokenization.tokenize)(deployment, req)
            gateway = None
        except OpenAIError as exc:
            gateway = exc
        if length < served:
            assert replica["type"] == "accepted" and gateway is None
        else:
            assert (replica["type"], replica["code"]) == ("error", "context_length_exceeded")
            assert (gateway.status, gateway.code, gateway.param) == (400, "context_length_exceeded", "prompt")
