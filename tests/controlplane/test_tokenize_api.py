"""vLLM's /tokenize and /detokenize on the gateway (controlplane/gateway/dialects/tokenize/), over
HTTP with an API key: the ids are those the chat and completion endpoints run (the same
tokenisation, checked against the `tokenizers` library itself), the special-token and
generation-prompt switches do what vLLM's do, detokenize inverts tokenize, and every bad input is
an OpenAI-style 4xx naming the parameter. That the count is a real completion's prompt_tokens:
tests/integration/test_tokenize_serving.py."""

from __future__ import annotations

import json
import shutil

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import processors

from controlplane.catalog.models import Model
from controlplane.deployments.models import Deployment
from controlplane.gateway import tokenization
from controlplane.gateway.dialects.openai.request import parse_chat
from controlplane.gateway.services import create_api_key
from workers.demo import MODEL_DIR
from workers.protocol.tokenizer import Tokenizer

TEXT = "The quick brown fox, naïve café 東京 🚀"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of Japan?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.fixture
def bos_dir(tmp_path):
    """The demo model whose tokenizer adds a BOS (`<|pad|>` here) when asked for special tokens."""
    directory = tmp_path / "bos"
    shutil.copytree(MODEL_DIR, directory)
    tok = HFTokenizer.from_file(str(directory / "tokenizer.json"))
    bos = tok.token_to_id("<|pad|>")
    tok.post_processor = processors.TemplateProcessing(single="<|pad|> $A", special_tokens=[("<|pad|>", bos)])
    tok.save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture
def api(db, django_user_model, client, bos_dir):
    def deploy(slug, source, source_type="local", **fields):
        model = Model.objects.create(name=slug, source=str(source), source_type=source_type, status=Model.Status.READY)
        return Deployment.objects.create(slug=slug, model=model, **fields)

    demo = deploy("demo", MODEL_DIR, max_model_len=300)
    deploy("bos", bos_dir)
    deploy("hub", "org/tiny", source_type="hub")
    deploy("other", MODEL_DIR)
    owner = django_user_model.objects.create_user("owner")
    secret = create_api_key(name="app", owner=owner)[1]
    only_other = create_api_key(name="o", owner=owner, allowed_deployments=[Deployment.objects.get(slug="other")])[1]

    def post(path, body, key=secret):
        raw = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return client.post(path, raw, "application/json", headers={"Authorization": f"Bearer {key}"} if key else {})

    post.demo, post.only_other = demo, only_other
    return post


def ok(response) -> dict:
    assert response.status_code == 200, response.content[:400]
    return response.json()


def error(response, status: int, param: str | None, code: str | None = None) -> str:
    assert response.status_code == status, response.content[:400]
    body = response.json()["error"]
    assert body["param"] == param, body
    if code is not None:
        assert body["code"] == code, body
    return body["message"]


@pytest.mark.parametrize("path", ["/tokenize", "/v1/tokenize"])
def test_a_prompt_is_tokenised_as_a_completion_runs_it(api, path):
    answer = ok(api(path, {"model": "demo", "prompt": TEXT}))
    expected = HFTokenizer.from_file(str(MODEL_DIR / "tokenizer.json")).encode(TEXT)
    assert answer == {"count": len(expected.ids), "max_model_len": 300, "tokens": expected.ids}
    with_strs = ok(api(path, {"model": "demo", "prompt": TEXT, "return_token_strs": True}))
    assert with_strs["tokens"] == expected.ids and with_strs["token_strs"] == expected.tokens


def test_a_chat_is_tokenised_as_the_chat_endpoint_runs_it(api):
    tok = Tokenizer(MODEL_DIR)
    counts = []
    for extra in ({"tools": [WEATHER]}, {}):
        answer = ok(api("/tokenize", {"model": "demo", "messages": CHAT, **extra}))
        runs = tokenization.prompt_ids(api.demo, parse_chat({"model": "demo", "messages": CHAT, **extra}))
        assert answer["tokens"] == runs and answer["count"] == len(runs)
        assert answer["max_model_len"] == 300
        counts.append(answer["count"])
    assert counts[0] > counts[1]  # the template renders the tools
    bare = ok(api("/tokenize", {"model": "demo", "messages": CHAT, "add_generation_prompt": False}))["tokens"]
    assert bare == tok.encode(tok.render_chat(CHAT, add_generation_prompt=False), add_special_tokens=False)
    assert len(bare) < len(runs) and runs[: len(bare)] == bare  # no assistant turn opened


def test_special_tokens_are_added_to_a_prompt_by_default_and_to_a_chat_only_when_asked(api, bos_dir):
    bos = Tokenizer(bos_dir).encode("", add_special_tokens=True)
    assert len(bos) == 1
    text = ok(api("/tokenize", {"model": "bos", "prompt": TEXT}))["tokens"]
    plain = ok(api("/tokenize", {"model": "bos", "prompt": TEXT, "add_special_tokens": False}))["tokens"]
    assert text == bos + plain
    chat = ok(api("/tokenize", {"model": "bos", "messages": CHAT}))["tokens"]  # the template writes its own
    chat_bos = ok(api("/tokenize", {"model": "bos", "messages": CHAT, "add_special_tokens": True}))["tokens"]
    assert chat_bos == bos + chat
    assert ok(api("/tokenize", {"model": "bos", "prompt": ""}))["tokens"] == bos
    assert ok(api("/tokenize", {"model": "bos", "prompt": "", "add_special_tokens": False}))["count"] == 0


@pytest.mark.parametrize("path", ["/detokenize", "/v1/detokenize"])
def test_detokenize_inverts_tokenize_and_keeps_special_tokens(api, path):
    ids = ok(api("/tokenize", {"model": "demo", "prompt": TEXT}))["tokens"]
    assert ok(api(path, {"model": "demo", "tokens": ids})) == {"prompt": TEXT}
    chat = ok(api("/tokenize", {"model": "demo", "messages": CHAT}))["tokens"]
    rendered = Tokenizer(MODEL_DIR).render_chat(CHAT)
    assert "<|end|>" in rendered and ok(api(path, {"model": "demo", "tokens": chat}))["prompt"] == rendered
    assert ok(api(path, {"model": "demo", "tokens": []})) == {"prompt": ""}


def test_bad_input_is_a_400_naming_the_parameter(api):
    vocab = Tokenizer(MODEL_DIR).vocab_size
    for body, param, code in [
        ({"prompt": TEXT}, "model", "missing"),
        ({"model": 7, "prompt": TEXT}, "model", "missing"),
        ({"model": "demo"}, "prompt", "missing"),
        ({"model": "demo", "prompt": TEXT, "messages": CHAT}, "messages", "invalid_value"),
        ({"model": "demo", "prompt": ["a", "b"]}, "prompt", "invalid_type"),
        ({"model": "demo", "prompt": [1, 2]}, "prompt", "invalid_type"),
        ({"model": "demo", "prompt": TEXT, "add_special_tokens": "yes"}, "add_special_tokens", "invalid_type"),
        ({"model": "demo", "prompt": TEXT, "return_token_strs": 1}, "return_token_strs", "invalid_type"),
        ({"model": "demo", "prompt": TEXT, "add_generation_prompt": True}, "add_generation_prompt", None),
        ({"model": "demo", "prompt": TEXT, "tools": [WEATHER]}, "tools", None),
        ({"model": "demo", "prompt": TEXT, "max_tokens": 3}, "max_tokens", "unknown_parameter"),
        ({"model": "demo", "messages": CHAT, "continue_final_message": True}, "continue_final_message", "unsupported"),
        ({"model": "demo", "messages": CHAT, "chat_template": "{{ x }}"}, "chat_template", "unsupported"),
        ({"model": "demo", "messages": []}, "messages", "invalid_type"),
        ({"model": "demo", "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", None),
        ({"model": "demo", "messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
        ({"model": "demo", "messages": CHAT, "tools": [{"type": "function"}]}, "tools", None),
    ]:
        error(api("/tokenize", body), 400, param, code)
    # vLLM's defaults spelt out are accepted.
    ok(api("/tokenize", {"model": "demo", "messages": CHAT, "continue_final_message": False, "chat_template": None,
                         "chat_template_kwargs": {}}))  # fmt: skip
    for tokens, code in [
        (None, "missing"),
        ("1 2", "invalid_type"),
        ([1, 2.5], "invalid_type"),
        ([1, True], "invalid_type"),
        ([[1]], "invalid_type"),
    ]:
        error(api("/detokenize", {"model": "demo", "tokens": tokens}), 400, "tokens", code)
    for out_of_vocab in (vocab, -1, 2**80):
        message = error(api("/detokenize", {"model": "demo", "tokens": [1, out_of_vocab]}), 400, "tokens")
        assert "out of vocabulary" in message and f"0 to {vocab - 1}" in message
    ok(api("/detokenize", {"model": "demo", "tokens": [vocab - 1]}))
    error(api("/detokenize", {"model": "demo", "tokens": [1], "skip": True}), 400, "skip", "unknown_parameter")
    error(api("/tokenize", b"{nope"), 400, None, "invalid_json")
    error(api("/tokenize", b"[1]"), 400, None, "invalid_json")


def test_the_model_and_the_key_are_checked_as_for_every_openai_endpoint(api, client):
    for path, body in (("/tokenize", {"prompt": TEXT}), ("/detokenize", {"tokens": [1]})):
        assert "does not exist" in error(api(path, {"model": "nope", **body}), 404, "model", "model_not_found")
        error(api(path, {"model": "demo", **body}, key=None), 401, None, "missing_api_key")
        error(api(path, {"model": "demo", **body}, key="sy-not-a-key"), 401, None, "invalid_api_key")
        error(api(path, {"model": "demo", **body}, key=api.only_other), 403, "model", "model_not_allowed")
        ok(api(path, {"model": "other", **body}, key=api.only_other))
        # A hub model's tokenizer is on the GPU nodes only.
        assert "cannot read its tokenizer" in error(api(path, {"model": "hub", **body}), 501, "model")
        assert client.get(path).status_code == 405
