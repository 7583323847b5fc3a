"""`n` and `logit_bias` through the real stack with the official `openai` client: n choices,
streamed and not, on colocated and disaggregated deployments; usage counts the prompt once and
every choice's completion; logit_bias forces and bans tokens; bad values are 400s naming them."""

from __future__ import annotations

from collections import defaultdict

import openai
import pytest

from tests.support.platform import DEMO, DEMO_PD, platform
from workers.demo import MODEL_DIR
from workers.protocol.tokenizer import Tokenizer

pytestmark = [pytest.mark.timeout(300), pytest.mark.django_db]
ASK = [{"role": "user", "content": "Tell me something."}]
FREE = {"ignore_eos": True}


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory):
    env = {"PD_LOCAL_PREFILL_TOKENS": "0"}
    with platform(django_db_blocker, tmp_path_factory, "choices", deployments=[DEMO, DEMO_PD], env=env) as p:
        yield p


@pytest.fixture
def client(stack):
    return stack.client()


@pytest.mark.parametrize("model", ["demo", "demo-pd"])
def test_n_chat_choices_whole_and_streamed(client, model):
    kwargs = {"model": model, "messages": ASK, "n": 3, "max_tokens": 8, "temperature": 2.0, "seed": 11,
              "extra_body": FREE}  # fmt: skip
    whole = client.chat.completions.create(**kwargs)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in whole.choices)
    texts = [c.message.content for c in whole.choices]
    assert len(set(texts)) > 1  # seed + i per choice: different samples
    assert whole.usage.completion_tokens == 3 * 8
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 24
    # The same request again reproduces every choice; streamed, the chunks carry each choice's index.
    assert [c.message.content for c in client.chat.completions.create(**kwargs).choices] == texts
    parts, finishes, usage = defaultdict(str), {}, None
    for chunk in client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            parts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert [parts[i] for i in range(3)] == texts
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert (usage.prompt_tokens, usage.completion_tokens) == (whole.usage.prompt_tokens, 24)


def test_n_completion_choices_whole_and_streamed(client):
    kwargs = {"model": "demo", "prompt": "Once upon a time", "n": 3, "max_tokens": 6, "temperature": 0}
    whole = client.completions.create(**kwargs, extra_body=FREE)
    texts = [c.text for c in whole.choices]
    single = client.completions.create(**{**kwargs, "n": 1}, extra_body=FREE).choices[0].text
    assert texts == [single] * 3  # greedy: every choice is the one answer
    assert whole.usage.completion_tokens == 18
    parts = defaultdict(str)
    for chunk in client.completions.create(**kwargs, extra_body=FREE, stream=True):
        for choice in chunk.choices:
            parts[choice.index] += choice.text
    assert [parts[i] for i in range(3)] == texts


def test_logit_bias_forces_and_bans_tokens(client):
    tok = Tokenizer(MODEL_DIR)
    kwargs = {"model": "demo", "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "extra_body": FREE}
    plain = client.completions.create(**kwargs).choices[0].text
    banned_ids = set(tok.encode(plain, add_special_tokens=False))
    banned = client.completions.create(**kwargs, logit_bias={str(t): -100 for t in banned_ids}).choices[0].text
    assert banned != plain
    assert not banned_ids & set(tok.encode(banned, add_special_tokens=False))
    forced_id = max(banned_ids)
    forced = client.completions.create(**kwargs, logit_bias={str(forced_id): 100}).choices[0].text
    assert forced == tok.decode([forced_id] * 6)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 17}, "n"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 500}}, "logit_bias"),
        ({"logit_bias": {"10000000": 1}}, "logit_bias"),  # past the vocabulary: the replica's 400
    ],
)
def test_bad_n_and_logit_bias_are_400s_naming_them(client, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="demo", messages=ASK, max_tokens=2, extra_body=extra)
    assert err.value.status_code == 400 and err.value.body["param"] == param
