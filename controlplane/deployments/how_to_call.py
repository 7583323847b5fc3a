"""The name a model directory is served under, and how to call it: shared by `manage.py
serve_model` and `make run MODEL=...` (scripts/run.py, which does not start Django), so this
module imports nothing of Django."""

from __future__ import annotations

import re
from pathlib import Path

MAX_NAME = 100  # Deployment.slug's max_length


def deployment_name(directory: str | Path) -> str:
    """The directory's own name as a deployment slug: lower case, each run of characters other
    than letters, digits, `_` and `-` one `-` (`Qwen2.5-0.5B-Instruct` → `qwen2-5-0-5b-instruct`)."""
    name = re.sub(r"[^a-z0-9_-]+", "-", Path(directory).expanduser().resolve().name.lower()).strip("-_")
    return name[:MAX_NAME].rstrip("-_") or "model"


def instructions(url: str, api_key: str, name: str) -> str:
    """Copy-paste examples for a served deployment: curl, and the openai Python client."""
    base = url.rstrip("/")
    return f"""Call {name}:
  curl {base}/v1/chat/completions -H "Authorization: Bearer {api_key}" -H "Content-Type: application/json" \\
    -d '{{"model": "{name}", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 32}}'
  curl {base}/v1/completions -H "Authorization: Bearer {api_key}" -H "Content-Type: application/json" \\
    -d '{{"model": "{name}", "prompt": "Once upon a time", "max_tokens": 32}}'
  python -c 'from openai import OpenAI
client = OpenAI(base_url="{base}/v1", api_key="{api_key}")
print(client.chat.completions.create(model="{name}", max_tokens=32,
      messages=[{{"role": "user", "content": "Hello!"}}]).choices[0].message.content)'"""
