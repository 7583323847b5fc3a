"""`make run MODEL=DIR` (`python -m scripts.run --model DIR`) end to end on a tiny random Llama
checkpoint built here, outside every model root: the stack starts, `manage.py serve_model`
registers and deploys the directory under its own name (no demo), make run says it is running
once the model answered and prints how to call it; the official openai client then gets
completions from it with that key, /tokenize counts what the completion counted, and Ctrl-C
stops every process. A directory that cannot be served is refused with the reason."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.engine.checkpoints import build_checkpoint
from tests.integration.test_make_run import (
    RUNNING_WITHIN,
    MakeRun,
    assert_all_gone,
    end_leftovers,
    run_env,
    stop_cleanly,
)

pytestmark = pytest.mark.timeout(600)


def test_make_run_serves_a_model_directory_and_the_openai_client_calls_it(tmp_path):
    directory = build_checkpoint(tmp_path / "models" / "Tiny.Llama", "llama", max_position_embeddings=256)
    state_dir = tmp_path / "state"
    env = run_env(state_dir)
    try:
        run = MakeRun(env, state_dir, ("--model", str(directory)))
        run.wait_line(r"^Switchyard is running\.$", RUNNING_WITHIN)
        info = json.loads((state_dir / "run.json").read_text())
        url, key = info["url"], info["api_key"]
        assert info["model"] == "tiny-llama"
        out = run.output
        assert f"[serve_model] registered model 'tiny-llama' from {directory.resolve()} (LlamaForCausalLM)" in out
        assert "[serve_model] created deployment 'tiny-llama'" in out
        assert "[serve_model] 'tiny-llama' answered a completion through" in out
        assert "demo" not in out  # not deployed, not waited for
        assert "Call tiny-llama:" in out and f'OpenAI(base_url="{url}v1", api_key="{key}")' in out

        client = openai.OpenAI(base_url=f"{url}v1", api_key=key, max_retries=0, timeout=60)
        models = client.models.list().data
        assert [(m.id, m.model_extra["root"], m.model_extra["max_model_len"]) for m in models] == [
            ("tiny-llama", "tiny-llama", 256)
        ]
        messages = [{"role": "user", "content": "The quick brown fox"}]
        chat = client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=6, temperature=0)
        assert chat.choices[0].message.content is not None and chat.usage.completion_tokens >= 1
        text = client.completions.create(
            model="tiny-llama", prompt="Prefill is compute bound;", max_tokens=6, temperature=0
        )
        assert text.usage.completion_tokens >= 1
        # /tokenize counts the prompts as the completions did.
        auth = {"Authorization": f"Bearer {key}"}
        counted = httpx.post(
            f"{url}tokenize", headers=auth, timeout=30, json={"model": "tiny-llama", "messages": messages}
        ).json()
        assert counted["count"] == chat.usage.prompt_tokens and counted["max_model_len"] == 256
        counted = httpx.post(
            f"{url}v1/tokenize",
            headers=auth,
            timeout=30,
            json={"model": "tiny-llama", "prompt": "Prefill is compute bound;"},
        ).json()
        assert counted["count"] == text.usage.prompt_tokens
        stop_cleanly(run, state_dir)
    finally:
        end_leftovers(state_dir)


def test_make_run_refuses_a_directory_it_cannot_serve_and_stops_everything(tmp_path):
    missing = MakeRun(run_env(tmp_path / "never"), tmp_path / "never", ("--model", str(tmp_path / "nope")))
    assert missing.proc.wait(timeout=60) == 2
    missing.reader.join(timeout=10)
    assert f"FAILED: MODEL={tmp_path / 'nope'}: no such directory" in missing.output

    directory = build_checkpoint(tmp_path / "models" / "no-weights", "llama")
    (directory / "model.safetensors").unlink()
    state_dir = tmp_path / "state"
    try:
        run = MakeRun(run_env(state_dir), state_dir, ("--model", str(directory)))
        assert run.proc.wait(timeout=RUNNING_WITHIN) == 1, run.output
        run.reader.join(timeout=10)
        assert "Switchyard is running" not in run.output
        assert f"{directory} cannot be served: {directory}: no model.safetensors" in run.output
        assert f"FAILED: serving {directory} did not succeed" in run.output
        assert "[switchyard] stopping..." in run.output
        assert_all_gone(state_dir)
    finally:
        end_leftovers(state_dir)
