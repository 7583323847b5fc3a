"""The gateway tokenises prompts itself (controlplane/gateway/tokenization.py): without torch or
the engine, cached per model directory, the replica is sent the ids; a prompt over the context
is refused before a replica is chosen, through the real API; a model the gateway cannot read
goes to the replica untokenised, logged once. That the ids are the replica's own, and the
context its engine's: tests/integration/test_gateway_tokenization.py."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys

import pytest
import redis
from asgiref.sync import async_to_sync
from django.conf import settings

from controlplane.catalog.models import Model
from controlplane.catalog.services import register_model, validate_model
from controlplane.deployments.models import Deployment
from controlplane.deployments.reconciler import reconcile_all
from controlplane.deployments.replica_states import transition_replica
from controlplane.deployments.services import create_deployment
from controlplane.gateway import tokenization
from controlplane.gateway.core.errors import OpenAIError
from controlplane.gateway.dialects.openai.request import parse_chat, parse_completion
from controlplane.gateway.services import create_api_key
from controlplane.inventory.services import register_node
from tests.support.played_replica import played_replica
from workers.demo import MODEL_DIR
from workers.protocol import replica as protocol
from workers.protocol.tokenizer import Tokenizer

CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Lima weather", "parameters": CITY}}
ASK = [{"role": "user", "content": "What is the weather in Lima?"}]


def deployment_of(directory, max_model_len: int | None = None, source_type: str = "local") -> Deployment:
    """An unsaved deployment of the model at `directory`: tokenization reads no database."""
    model = Model(name="tok", source=str(directory), source_type=source_type)
    return Deployment(slug="tok", model=model, max_model_len=max_model_len)


def tokenize(deployment: Deployment, req):
    async_to_sync(tokenization.tokenize)(deployment, req)
    return req


def test_the_web_process_tokenises_without_torch_or_the_engine():
    code = (
        "import django, os, sys; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'controlplane.config.settings');"
        "django.setup(); import controlplane.config.urls, controlplane.config.asgi;"
        "from controlplane.gateway import tokenization;"
        "from controlplane.gateway.dialects.openai.request import parse_chat;"
        "from controlplane.catalog.models import Model; from controlplane.deployments.models import Deployment;"
        f"dep = Deployment(model=Model(name='m', source={str(MODEL_DIR)!r}));"
        "req = parse_chat({'model': 'm', 'messages': [{'role': 'user', 'content': 'hi'}]});"
        "assert tokenization.prompt_ids(dep, req) and tokenization.context_length(dep) == 512;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m.startswith('workers.engine')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_replica_is_sent_the_ids_the_replica_would_have_computed():
    deployment = deployment_of(MODEL_DIR)
    tok = Tokenizer(MODEL_DIR)
    chat = tokenize(deployment, parse_chat({"model": "tok", "messages": ASK, "tools": [WEATHER]}))
    assert chat.prompt_token_ids == tok.prompt_ids(ASK, [WEATHER])
    message = chat.replica_message()
    # Ids alone: the replica needs neither the messages nor the tools (the gateway parses calls).
    assert (message.prompt_token_ids, message.messages, message.tools) == (chat.prompt_token_ids, None, None)
    # tool_choice "none": the tools are not rendered, as the replica did not render them.
    unoffered = tokenize(
        deployment, parse_chat({"model": "tok", "messages": ASK, "tools": [WEATHER], "tool_choice": "none"})
    )
    assert unoffered.prompt_token_ids == tok.prompt_ids(ASK) != chat.prompt_token_ids
    text = tokenize(deployment, parse_completion({"model": "tok", "prompt": "Hello there"}))
    assert text.prompt_token_ids == tok.encode("Hello there")
    ids = tokenize(deployment, parse_completion({"model": "tok", "prompt": [5, 6, 7]}))
    assert ids.prompt_token_ids == [5, 6, 7]


def test_a_conversation_the_template_refuses_is_a_400_naming_the_messages(tmp_path):
    directory = tmp_path / "strict"
    shutil.copytree(MODEL_DIR, directory)
    (directory / "chat_template.jinja").write_text(
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}x"
    )
    req = parse_chat({"model": "tok", "messages": [{"role": "system", "content": "Be brief."}, *ASK]})
    with pytest.raises(OpenAIError) as err:
        tokenize(deployment_of(directory), req)
    assert (err.value.status, err.value.param, err.value.code) == (400, "messages", "invalid_value")
    assert err.value.message == "System role not supported"


def test_the_context_check_refuses_what_the_engine_refuses_and_names_the_prompt():
    deployment = deployment_of(MODEL_DIR, max_model_len=64)
    assert tokenization.context_length(deployment) == 64
    assert tokenization.context_length(deployment_of(MODEL_DIR)) == 512  # the model's own
    # The engine refuses a prompt that leaves no token to generate; a max_tokens past the room
    # left is cut short there (finish_reason "length"), not refused.
    tokenize(deployment, parse_completion({"model": "tok", "prompt": list(range(5, 68)), "max_tokens": 1000}))
    for req, param in [
        (parse_completion({"model": "tok", "prompt": list(range(5, 69))}), "prompt"),
        (parse_completion({"model": "tok", "prompt": "word " * 200}), "prompt"),
        (parse_chat({"model": "tok", "messages": [{"role": "user", "content": "word " * 200}]}), "messages"),
    ]:
        with pytest.raises(OpenAIError) as err:
            tokenize(deployment, req)
        assert (err.value.status, err.value.code, err.value.param) == (400, "context_length_exceeded", param)
        assert "maximum context length is 64 tokens" in err.value.message


def test_a_model_the_gateway_cannot_read_goes_untokenised_and_is_logged_once(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(tokenization, "_reported", set())
    caplog.set_level(logging.WARNING, logger=tokenization.__name__)
    for deployment in (deployment_of("org/tiny", source_type="hub"), deployment_of(tmp_path / "not-mounted-here")):
        for _ in range(2):
            req = tokenize(deployment, parse_chat({"model": "tok", "messages": ASK, "tools": [WEATHER]}))
            assert req.prompt_token_ids is None and tokenization.context_length(deployment) is None
            message = req.replica_message()  # as before: the replica renders and tokenises
            assert (message.messages, message.tools, message.prompt_token_ids) == (ASK, [WEATHER], None)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and "org/tiny" in warnings[0] and "not-mounted-here" in warnings[1]


def test_tokenizers_are_cached_per_directory_and_read_again_when_replaced(tmp_path):
    directory = tmp_path / "swap"
    shutil.copytree(MODEL_DIR, directory)
    model = deployment_of(directory).model
    first = tokenization.model_text(model)
    assert tokenization.model_text(model) is first
    tokenizer_json = directory / "tokenizer.json"
    later = tokenizer_json.stat().st_mtime + 5
    os.utime(tokenizer_json, (later, later))
    again = tokenization.model_text(model)
    assert again is not first and tokenization.model_text(model) is again


# -- through the API: refused before a replica is chosen ------------------------------------------
LIMIT = 200  # the deployment's max_model_len (the chat with a tool is 150 tokens or so)


@pytest.fixture
def served(db, model_dir, django_user_model):
    """A deployment of the tiny checkpoint (max_model_len LIMIT) with one ready replica, which a
    thread plays: it answers each `generate` on the replica's stream with one token."""
    register_node(
        name="node-t",
        hostname="node-t",
        devices=[{"index": 0, "kind": "cuda", "name": "H200", "memory_total": 141 << 30}],
    )
    model = validate_model(register_model(name="tiny-tok", source=str(model_dir)).pk)
    deployment = create_deployment({"slug": "tok", "model": model, "replicas": 1, "max_model_len": LIMIT})
    reconcile_all()
    [replica] = deployment.replica_set.all()
    transition_replica(replica.pk, "starting", pid=4242)
    transition_replica(replica.pk, "ready")
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    _, key = create_api_key(name="tok", owner=django_user_model.objects.create_user("tok-owner"))
    with played_replica(client, replica.pk, "tok-1") as seen:
        yield {"key": key, "stream": protocol.requests_key(replica.pk), "seen": seen, "redis": client, "dir": model_dir}


def _post(client, served, path: str, body: dict):
    return client.post(path, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {served['key']}")


def _generates(served) -> int:
    entries = served["redis"].xrange(served["stream"])
    return sum(json.loads(fields["m"])["type"] == "generate" for _, fields in entries)


def test_a_prompt_over_the_context_is_refused_before_any_replica_is_chosen(client, served):
    ok = _post(client, served, "/v1/chat/completions", {"model": "tok", "messages": ASK, "tools": [WEATHER]})
    assert ok.status_code == 200, ok.json()
    [sent] = served["seen"]  # what reached the replica: the gateway's ids, no messages or tools
    assert sent["prompt_token_ids"] == Tokenizer(served["dir"]).prompt_ids(ASK, [WEATHER])
    assert "messages" not in sent and "tools" not in sent and "return_prompt_token_ids" not in sent
    assert ok.json()["usage"]["prompt_tokens"] == len(sent["prompt_token_ids"])

    long_chat = {"model": "tok", "messages": [{"role": "user", "content": "fox " * 300}]}
    for path, body, param in [
        ("/v1/chat/completions", long_chat, "messages"),
        ("/v1/chat/completions", {**long_chat, "stream": True}, "messages"),
        ("/v1/completions", {"model": "tok", "prompt": "fox " * 300}, "prompt"),
        ("/v1/completions", {"model": "tok", "prompt": list(range(5, 5 + LIMIT)), "max_tokens": 1}, "prompt"),
    ]:
        refused = _post(client, served, path, body)
        assert refused.status_code == 400, refused.content
        error = refused.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error",
            "context_length_exceeded",
            param,
        )
        assert f"maximum context length is {LIMIT} tokens" in error["message"]
    assert _generates(served) == 1  # nothing more reached the replica's stream
    # One token shorter fits: it leaves one to generate.
    shorter = {"model": "tok", "prompt": list(range(5, 4 + LIMIT)), "max_tokens": 9}
    fits = _post(client, served, "/v1/completions", shorter)
    assert fits.status_code == 200 and _generates(served) == 2
