"""/tokenize through the real stack (web, control worker, node agent, a demo replica): its count
is the `prompt_tokens` a real completion of the same prompt reports, for a text prompt, a chat,
and a chat with tools, with the official openai client; /detokenize gives the prompt back."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.platform import platform
from workers.demo.corpus import tool_schemas

pytestmark = [pytest.mark.timeout(300), pytest.mark.django_db]


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory):
    demo = {"slug": "demo", "replicas": 1, "max_model_len": 384}
    with platform(django_db_blocker, tmp_path_factory, "tok", deployments=[demo]) as p:
        yield p.base, p.key


def test_tokenize_counts_the_prompt_tokens_a_completion_reports(stack):
    base, key = stack
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)

    def tokenize(**body):
        answer = httpx.post(
            f"{base}/tokenize", json={"model": "demo", **body}, timeout=30, headers={"Authorization": f"Bearer {key}"}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["max_model_len"] == 384
        return answer.json()

    prompt = "The capital of France is"
    text = client.completions.create(model="demo", prompt=prompt, max_tokens=4, temperature=0)
    counted = tokenize(prompt=prompt)
    assert counted["count"] == text.usage.prompt_tokens == len(counted["tokens"])
    back = httpx.post(
        f"{base}/detokenize",
        json={"model": "demo", "tokens": counted["tokens"]},
        timeout=30,
        headers={"Authorization": f"Bearer {key}"},
    )
    assert back.json() == {"prompt": prompt}

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the weather in Lima?"}]
    tools = tool_schemas()[:2]
    for extra in ({}, {"tools": tools}):
        chat = client.chat.completions.create(model="demo", messages=messages, max_tokens=4, temperature=0, **extra)
        assert tokenize(messages=messages, **extra)["count"] == chat.usage.prompt_tokens
    assert tokenize(messages=messages, tools=tools)["count"] > tokenize(messages=messages)["count"]
