"""`bench spec`'s stack run: the demo model served by `make run` (its own Redis, a temporary state
directory), one replica at a time, under `CLIENTS` concurrent clients that each send the next
chat as soon as the last one ended; first a deployment that does not speculate, then one with
`speculative_method: auto` and the demo's EAGLE-3 head. The chats are the bench's own held-out
prompts (tool calls and plain questions, alternating), streamed, greedy, as the OpenAI API takes
them.

Each deployment gets `warmup` seconds of the load first (a replica with `auto` learns its costs
in its first steps) and is then measured for `seconds`: requests completed per second, TTFT p50,
and ITL p50 (per request, (last token - first token) / (tokens - 1), so a step that emits several
tokens counts as what the client sees). Last key of the bench's JSON: {"stack": {"none": {"rps",
"ttft_p50_ms", "itl_p50_ms"}, "auto": {...}}}.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import httpx

from workers.bench.autoscale import Sent, api, log, settle, stream_chat
from workers.bench.chaos import Stack
from workers.bench.processes import environ, percentile

CLIENTS = 32
MAX_TOKENS = 64
DEPLOYMENTS = {
    "spec-none": {"speculative_method": "none"},
    "spec-auto": {"speculative_method": "auto", "speculative_k": 3, "draft_model": "demo-draft"},
}


async def chat(http: httpx.AsyncClient, stack: Stack, slug: str, messages: list[dict], tools: list | None) -> Sent:
    """One streamed greedy chat, timed (autoscale.stream_chat)."""
    body = {"model": slug, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, **({"tools": tools} if tools else {})}  # fmt: skip
    return await stream_chat(http, stack, body, Sent(start=time.monotonic(), expected=MAX_TOKENS))


async def load(http, stack: Stack, slug: str, chats: list, seconds: float) -> list[Sent]:
    """CLIENTS closed loops for `seconds`; the chats that ended inside that time."""
    deadline = time.monotonic() + seconds
    turns = itertools.cycle(chats)
    done: list[Sent] = []

    async def client() -> None:
        while time.monotonic() < deadline:
            messages, tools = next(turns)
            rec = await chat(http, stack, slug, messages, tools)
            if time.monotonic() <= deadline:
                done.append(rec)

    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return done


def summary(chats: list[Sent], seconds: float) -> dict:
    ok = [c for c in chats if c.error is None and c.first is not None]
    itls = [(c.last - c.first) / (c.tokens - 1) * 1000 for c in ok if c.tokens > 1 and c.last > c.first]
    return {
        "rps": round(len(ok) / seconds, 2),
        "ttft_p50_ms": round(percentile([(c.first - c.start) * 1000 for c in ok], 0.5), 1) if ok else None,
        "itl_p50_ms": round(percentile(itls, 0.5), 2) if itls else None,
        "failed": len(chats) - len(ok),
    }


async def _main(chats: list, seconds: float, warmup: float, quiet: bool) -> dict:
    with environ(CPU_REPLICAS_PER_DEVICE="2"):
        log("stack run: starting make run on its own Redis", quiet)
        stack = Stack(quiet, hang_seconds=60.0)
    out = {}
    try:
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(300, connect=10), limits=httpx.Limits(max_connections=None)
        ) as http:
            await api(stack, "PATCH", "deployments/demo/", {"replicas": 0})  # the CPU for one replica at a time
            await settle(stack, 0, slug="demo")
            for slug, speculation in DEPLOYMENTS.items():
                await api(stack, "POST", "deployments/", {"slug": slug, "model": "demo", "replicas": 1, **speculation})
                await settle(stack, 1, timeout=300, slug=slug)
                await load(http, stack, slug, chats, warmup)
                result = summary(await load(http, stack, slug, chats, seconds), seconds)
                name = slug.removeprefix("spec-")
                out[name] = result
                log(f"stack run, {name}: {json.dumps(result)}", quiet)
                await api(stack, "POST", f"deployments/{slug}/scale/", {"replicas": 0})
                await settle(stack, 0, slug=slug)
    finally:
        stack.close(keep=False)
    return out


def run(chats: list, seconds: float, warmup: float, quiet: bool) -> dict:
    """{"none": {...}, "auto": {...}} (see the module's docstring), each with its `failed` count."""
    return asyncio.run(_main(chats, seconds, warmup, quiet))
