"""One request cannot take a deployment down: real uvicorn, control worker, node agent and two
replica processes of the demo model, whose engines run the test-only faults (workers/engine/
faults.py, SWITCHYARD_TEST_FAULTS=1): a request whose regex is `switchyard-test-fault` makes the
engine raise while stepping it, `switchyard-test-crash` makes the replica process exit.

- Raised inside the engine: the request fails once, cleanly (500 engine_error, OpenAI's shape,
  whole or streamed), is not sent to the other replica, the requests beside it finish, and no
  replica restarts.
- Crashing its replica: the request fails (502 replicas_lost) after two replica deaths, not sent to
  a third; the second death is attributed to it and does not count. The agent here gives up on a
  replica at its first counted death and the deployment at its second failed replica, so the two
  deaths counted as two would fail the deployment: it stays running and serves again.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests.support.platform import platform
from tests.support.stack import metric, replica_status, wait_for
from workers.protocol import replica as protocol

pytestmark = [pytest.mark.timeout(420), pytest.mark.django_db]
MAX_TOKENS = 64
LONG = 200  # the requests beside a faulty one: still running when it fails, however loaded the machine
FAULT = {"structured_outputs": {"regex": "switchyard-test-fault"}}
CRASH = {"structured_outputs": {"regex": "switchyard-test-crash"}}


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory):
    env = {"SWITCHYARD_TEST_FAULTS": "1", "REPLICA_MAX_RESTARTS": "0", "REPLICA_FAILURE_BUDGET": "2"}
    pair = {"slug": "pair", "replicas": 2}
    with platform(django_db_blocker, tmp_path_factory, "poison", deployments=[pair], env=env) as p:
        yield p


def serving(stack) -> dict[int, int]:
    """Both replicas ready, heartbeating and idle: {replica id: pid}."""
    from controlplane.deployments.models import Replica

    pair = stack.deployments["pair"]

    def ready():
        ids = list(Replica.objects.filter(deployment=pair, state="ready").values_list("id", flat=True))
        statuses = {i: replica_status(i) for i in ids}
        fine = all(
            s.get("state") == "ready"
            and protocol.ReplicaStatus.from_hash(s).is_fresh()
            and json.loads(s.get("load") or "{}").get("running") == 0
            for s in statuses.values()
        )
        return {i: json.loads(s["endpoint"])["pid"] for i, s in statuses.items()} if len(ids) == 2 and fine else None

    return wait_for(ready, 180, "2 idle ready replicas")


def crashes(stack) -> list[dict]:
    from controlplane.deployments.models import Replica
    from controlplane.events.models import Event

    ids = [str(i) for i in Replica.objects.filter(deployment=stack.deployments["pair"]).values_list("id", flat=True)]
    return list(
        Event.objects.filter(verb="replica.crashed", object_id__in=ids).order_by("id").values_list("data", flat=True)
    )


def status(stack) -> str:
    from controlplane.deployments.models import Deployment

    return Deployment.objects.get(pk=stack.deployments["pair"].pk).status


def body(i: int, **extra) -> dict:
    return {"model": "pair", "prompt": f"Q: What is the capital of country {i}?\nA:", "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "temperature": 0, **extra}  # fmt: skip


async def stream(client: httpx.AsyncClient, payload: dict, progress: list, i: int) -> dict:
    """One SSE completion: its text pieces, its error chunk if any, the line that ended it."""
    out = {"pieces": 0, "error": None, "finish": None, "last": None}
    async with client.stream("POST", "/v1/completions", json={**payload, "stream": True}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            out["last"] = data = line.removeprefix("data: ")
            if data == "[DONE]":
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                out["error"] = chunk["error"]
                continue
            for choice in chunk["choices"]:
                if choice.get("text"):
                    out["pieces"] += 1
                    progress[i] += 1
                out["finish"] = choice.get("finish_reason") or out["finish"]
    return out


async def until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(0.01)


def test_a_request_the_engine_fails_on_fails_once_and_the_others_finish(stack):
    pids = serving(stack)
    errors_before = metric(stack.base, "switchyard_engine_request_errors_total", deployment="pair")
    resumed_before = metric(stack.base, "switchyard_requests_resumed_total", deployment="pair")
    n = 4

    async def main():
        progress = [0] * n
        headers = {"Authorization": f"Bearer {stack.key}"}
        async with httpx.AsyncClient(base_url=stack.base, headers=headers, timeout=120) as client:
            others = asyncio.gather(*(stream(client, body(i, max_tokens=LONG), progress, i) for i in range(n)))
            await until(lambda: all(progress), 60, "every other request to stream")  # in flight on both replicas
            whole, streamed = await asyncio.gather(
                client.post("/v1/completions", json=body(n, **FAULT)),
                stream(client, body(n + 1, **FAULT), [0] * (n + 2), n + 1),
            )
            unfinished = sum(p < LONG for p in progress)
            return whole, streamed, unfinished, await asyncio.wait_for(others, 180)

    whole, streamed, unfinished, others = asyncio.run(main())
    assert whole.status_code == 500, whole.text
    error = whole.json()["error"]
    assert error["code"] == "engine_error" and error["type"] == "server_error" and set(error) >= {"message", "param"}
    assert error["message"].startswith("the engine failed on request cmpl-") and "injected fault" in error["message"]
    assert streamed["error"]["code"] == "engine_error" and streamed["last"] == "[DONE]"
    assert streamed["pieces"] <= 2  # what it streamed before the fault (two tokens), then the error
    assert unfinished >= 1  # the fault came while others were still running
    for got in others:
        assert got["error"] is None and got["finish"] == "length" and got["last"] == "[DONE]"
    # Failed where it was sent, once each: not resumed on the other replica (it would fail again there).
    # Each replica counted its errors before the client heard of them: read after a newer heartbeat.
    answered = time.time()
    wait_for(
        lambda: all(float(replica_status(i).get("heartbeat") or 0) > answered for i in pids),
        10,
        "a heartbeat of each replica after the answers",
    )
    assert metric(stack.base, "switchyard_engine_request_errors_total", deployment="pair") == errors_before + 2
    assert metric(stack.base, "switchyard_requests_resumed_total", deployment="pair") == resumed_before
    assert serving(stack) == pids and crashes(stack) == [] and status(stack) == "running"


def test_a_request_that_crashes_replicas_fails_after_two_deaths_and_the_deployment_stays_running(stack):
    serving(stack)
    headers = {"Authorization": f"Bearer {stack.key}"}
    r = httpx.post(stack.base + "/v1/completions", headers=headers, json=body(0, **CRASH), timeout=120)
    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert error["code"] == "replicas_lost" and "not sent to another" in error["message"]
    rid = error["message"].split()[1]  # "Request cmpl-... was running on two replicas ..."

    first, second = wait_for(lambda: (found := crashes(stack)) and len(found) == 2 and found, 30, "two crash events")
    assert first["exit_code"] == second["exit_code"] == 70
    assert first["counted"] is True and first["request_id"] is None  # nobody could suspect it yet
    assert second["counted"] is False and second["request_id"] == rid
    assert metric(stack.base, "switchyard_poison_requests_total", deployment="pair") == 1
    wait_for(
        lambda: metric(stack.base, "switchyard_replica_crashes_total", deployment="pair") == 2,
        10,
        "the crashes to be counted",
    )
    assert metric(stack.base, "switchyard_replica_crashes_total", deployment="pair", attributed="true") == 1
    # The first replica was given up on and replaced, the second restarted: both serve again, the
    # deployment never failed, and no third replica died of the request.
    assert status(stack) == "running"
    serving(stack)
    assert status(stack) == "running" and len(crashes(stack)) == 2
    ok = httpx.post(stack.base + "/v1/completions", headers=headers, json=body(1), timeout=60)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"
