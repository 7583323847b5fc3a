"""Faults through the real stack (uvicorn, control worker, node agent, demo-model replicas) on
its own redis-server, so that Redis itself can be stopped (the machine's never is):

- the node agent is SIGKILLed under 20 streams: none is lost (replicas outlive their agent, and
  the next agent adopts them);
- Redis is killed under a stream and started again, empty: the stream ends with an OpenAI error
  event and [DONE], never cut, and new requests are served again once Redis is back.
(Replica SIGKILL and SIGSTOP under 20 streams: tests/integration/test_failover.py.)"""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest

from tests.support.platform import platform as start_platform
from tests.support.stack import pid_alive, start_agent, wait_for, wait_ready
from workers.bench.processes import RedisServer, stop

pytestmark = [pytest.mark.timeout(300), pytest.mark.django_db(transaction=True)]
QUESTION = [{"role": "user", "content": "What is the capital of Japan?"}]


@pytest.fixture
def redis_server():
    """The stack's own redis-server, for a test to stop and start."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def platform(tmp_path_factory, redis_server):
    """The stack on its own Redis, with an API key and a management token; no deployment yet (_deploy's
    request is the first)."""
    url = redis_server.url
    env = {"REDIS_URL": url, "CELERY_BROKER_URL": url, "CHANNELS_PREFIX": f"faults-{uuid.uuid4().hex[:6]}"}
    with start_platform(None, tmp_path_factory, "faults", deployments=[], env=env, staff=True, token=True) as p:
        yield p


def _deploy(platform, replicas: int):
    """Through the management API: the web process's Celery app (unlike this process's) sends
    the reconcile to this stack's Redis."""
    body = {"slug": "demo", "model": platform.model.name, "replicas": replicas, "max_num_seqs": 32}
    created = httpx.post(
        f"{platform.base}/api/v1/deployments/",
        json=body,
        timeout=30,
        headers={"Authorization": f"Bearer {platform.token}"},
    )
    assert created.status_code == 201, created.text
    return wait_ready(created.json()["slug"], replicas, 120)


async def _stream(base: str, key: str, max_tokens: int, started: asyncio.Event | None = None) -> dict:
    """One streamed chat completion: its text, the error event if any, and whether [DONE] came."""
    body = {"model": "demo", "messages": QUESTION, "temperature": 0, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}  # fmt: skip
    out = {"text": "", "error": None, "done": False}
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        httpx.AsyncClient(timeout=120) as client,
        client.stream("POST", f"{base}/v1/chat/completions", json=body, headers=headers) as response,
    ):
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out["done"] = True
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                out["error"] = chunk["error"]
                continue
            for choice in chunk.get("choices", []):
                out["text"] += choice["delta"].get("content") or ""
                if out["text"] and started is not None:
                    started.set()
    return out


def test_agent_killed_under_twenty_streams_loses_none(platform):
    replicas = _deploy(platform, 2)
    base, key = platform.base, platform.key
    undisturbed = asyncio.run(_stream(base, key, 48))
    assert undisturbed["done"] and not undisturbed["error"]

    async def run():
        started = asyncio.Event()
        tasks = [asyncio.create_task(_stream(base, key, 48, started)) for _ in range(20)]
        await asyncio.wait_for(started.wait(), 60)
        agent = platform.procs[1]
        agent.kill()  # SIGKILL, mid-stream
        agent.wait()
        return await asyncio.gather(*tasks)

    results = asyncio.run(run())
    assert [r["error"] for r in results] == [None] * 20
    assert all(r["done"] and r["text"] == undisturbed["text"] for r in results)
    assert all(pid_alive(r.pid) for r in replicas)  # the replicas outlived their agent

    agent, agent_log = start_agent(platform.state, platform.node, platform.env, log_name="agent-2")
    try:
        adopted = sorted(r.pk for r in replicas)
        wait_for(lambda: f"adopted replicas {adopted}" in (platform.state / "agent-2.log").read_text(), 60, "adoption")
        again = asyncio.run(_stream(base, key, 8))
        assert again["done"] and not again["error"]
    finally:
        stop([agent], [agent_log])
    # The agent that adopted them stopped them, as a clean agent shutdown does (a SIGTERM while
    # its Celery worker was still starting once left them running past the test).
    wait_for(lambda: not any(pid_alive(r.pid) for r in replicas), 30, "the adopted replicas to stop")


def test_redis_restart_ends_streams_cleanly_and_service_comes_back(platform, redis_server):
    from django.utils import timezone

    from controlplane.inventory.models import Node

    _deploy(platform, 1)
    base, key, server = platform.base, platform.key, redis_server

    async def run():
        started = asyncio.Event()
        task = asyncio.create_task(_stream(base, key, 100_000, started))  # runs until Redis goes away
        await asyncio.wait_for(started.wait(), 60)
        server.kill()
        return await asyncio.wait_for(task, 60)

    cut = asyncio.run(run())
    assert cut["done"], "the stream was cut without [DONE]"
    assert cut["error"]["code"] == "broker_unavailable" and cut["text"]

    server.start()  # back, and empty
    returned = timezone.now()

    last = []

    def served():
        try:
            result = asyncio.run(asyncio.wait_for(_stream(base, key, 8), 30))
        except (AssertionError, httpx.HTTPError, TimeoutError) as exc:
            last[:] = [repr(exc)]
            return None
        last[:] = [result]
        return result if result["done"] and not result["error"] else None

    try:
        assert wait_for(served, 60, "a request to be served after Redis returned", interval=0.5)["text"]
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the last attempt: {last}") from None
    # The Celery side came back too: the agent's reports reach the control worker again.
    wait_for(
        lambda: Node.objects.get(name=platform.node).last_heartbeat > returned,
        30,
        "the control worker to apply a node report sent after Redis returned",
    )
