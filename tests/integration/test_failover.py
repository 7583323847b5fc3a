"""Mid-stream failover and liveness through real processes: uvicorn, the control worker, a node
agent and replica processes on the demo model. A replica is killed (SIGKILL) or stopped
(SIGSTOP) for real while it streams; its requests resume on the other replica and every client
gets the answer an undisturbed run gives, told where it moved. With no other replica, the stream
ends with an error event and [DONE]; with FAILOVER off too. A stopped replica leaves routing as
soon as its heartbeat is stale."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
import uuid
from dataclasses import replace

import httpx
import pytest
import redis
from django.conf import settings
from websockets.asyncio.client import connect as ws_connect

from tests.support.freeze import freeze
from tests.support.otlp import otlp_receiver
from tests.support.platform import platform
from tests.support.stack import metric, pid_alive, replica_status, wait_for
from workers.protocol import replica as protocol

pytestmark = [pytest.mark.timeout(420), pytest.mark.django_db]
N, MAX_TOKENS, KILL_AFTER = 20, 48, 3  # requests per burst, tokens each, pieces every stream has before the kill
COUNTRIES = ["Japan", "Peru", "France", "Kenya", "Chile", "Egypt", "Spain", "Italy", "Norway", "Canada"]


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory):
    # The agent must not kill the replica a test stops: the test lets it go on itself.
    # A disaggregated deployment's prompts all go to its prefill replica.
    env = {"REPLICA_HANG_SECONDS": "300", "PD_LOCAL_PREFILL_TOKENS": "0", "CPU_REPLICAS_PER_DEVICE": "6"}
    pair, solo = {"slug": "pair", "replicas": 2}, {"slug": "solo", "replicas": 1}
    pd = {"slug": "pd-pair", "mode": "disaggregated", "prefill_replicas": 1, "decode_replicas": 2, "replicas": 0}
    with platform(django_db_blocker, tmp_path_factory, "failover", deployments=[pair, solo, pd], env=env) as p:
        yield p


@pytest.fixture(scope="module")
def plain(stack):
    """A second web process with failover turned off; its base URL."""
    with stack.web("web-plain", FAILOVER="false") as base:
        yield base


def _fresh(status: dict) -> bool:
    return protocol.ReplicaStatus.from_hash(status).is_fresh()


def _pid(replica_id: int) -> int:
    return json.loads(replica_status(replica_id)["endpoint"])["pid"]


def serving(deployment_id: int, n: int, role: str | None = None) -> list[int]:
    """Wait until the deployment's `n` replicas (of `role`) are ready, heartbeating and idle (a
    replica killed by the previous test has been restarted); their ids."""
    from controlplane.deployments.models import Replica

    def ready():
        replicas = Replica.objects.filter(deployment_id=deployment_id, state="ready")
        if role is not None:
            replicas = replicas.filter(role=role)
        ids = sorted(replicas.values_list("id", flat=True))
        statuses = [replica_status(i) for i in ids]
        loads = [json.loads(s.get("load") or "{}") for s in statuses]
        fine = all(s.get("state") == "ready" and _fresh(s) for s in statuses) and all(
            load.get("running") == 0 and load.get("waiting") == 0 for load in loads
        )
        return ids if len(ids) == n and fine else None

    return wait_for(ready, 60, f"{n} idle ready replicas")


def events(verb: str, deployment_id: int) -> list[dict]:
    from controlplane.events.models import Event

    return list(Event.objects.filter(verb=verb, object_id=str(deployment_id)).values_list("data", flat=True))


# -- clients -------------------------------------------------------------------------------------
def request(i: int, deployment: str, **params) -> tuple[str, dict]:
    """The i-th request of a burst: SSE chat (with usage), SSE completion (with logprobs), a
    JSON chat, or a websocket chat."""
    kind = ("ws", "completion", "json", "chat", "chat")[i % 5]
    question = f"What is the capital of {COUNTRIES[i % len(COUNTRIES)]}?"
    body = {"model": deployment, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0, **params}
    if kind == "completion":
        return kind, {**body, "prompt": f"Q: {question}\nA:", "stream": True, "logprobs": 1}
    body["messages"] = [{"role": "user", "content": question}]
    if kind == "chat":
        body.update(stream=True, stream_options={"include_usage": True})
    return kind, body


async def sse(client: httpx.AsyncClient, kind: str, body: dict, progress: list, i: int, seen: dict | None = None):
    """One SSE request, counting the pieces of text as they arrive (a test kills a replica on
    them); `seen[i]` is its replica as soon as the headers name it."""
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    lines = []
    async with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, await r.aread()
        replica = int(r.headers["x-switchyard-replica"])
        if seen is not None:
            seen[i] = replica
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                lines.append(line)
                # A piece of text, not the opening chunk's empty content (the role's).
                if re.search(r'"(content|text)": "[^"]', line):
                    progress[i] += 1
    return {**_parse(kind, lines), "replica": replica}


def _parse(kind: str, lines: list[str]) -> dict:
    out = {"text": "", "tokens": [], "logprobs": [], "usage": None, "note": None, "finish": None, "error": None}
    data = [line.removeprefix("data: ") for line in lines]
    out["last"] = data[-1] if data else None
    for raw in data[:-1]:
        chunk = json.loads(raw)
        if "error" in chunk:
            out["error"] = chunk["error"]
            continue
        out["id"] = chunk["id"]
        out["usage"] = chunk.get("usage") or out["usage"]
        for choice in chunk["choices"]:
            out["text"] += (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            if choice.get("logprobs") and kind == "completion":
                out["tokens"] += choice["logprobs"]["tokens"]
                out["logprobs"] += choice["logprobs"]["token_logprobs"]
            if choice.get("finish_reason"):
                out["finish"] = choice["finish_reason"]
                out["note"] = (chunk.get("x_switchyard") or {}).get("resumed")
    return out


async def whole(client: httpx.AsyncClient, body: dict) -> dict:
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    return {"text": answer["choices"][0]["message"]["content"], "usage": answer["usage"], "id": answer["id"],
            "finish": answer["choices"][0]["finish_reason"], "replica": int(r.headers["x-switchyard-replica"]),
            "note": (answer.get("x_switchyard") or {}).get("resumed"), "error": None, "last": "[DONE]"}  # fmt: skip


async def websocket(stack, body: dict, progress: list, i: int, seen: dict | None = None) -> dict:
    out = {"text": "", "usage": None, "note": None, "finish": None, "error": None, "last": "[DONE]"}
    async with ws_connect(f"ws://127.0.0.1:{stack.port}/ws/generate/?api_key={stack.key}", open_timeout=10) as ws:
        await ws.send(json.dumps({"id": "r", **body}))
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if event["type"] == "start":
                out["replica"], out["id"] = event["replica"], event["request_id"]
                if seen is not None:
                    seen[i] = event["replica"]
            elif event["type"] == "token":
                out["text"] += event["text"]
                progress[i] += 1
            elif event["type"] == "done":
                out.update(usage=event["usage"], finish=event["finish_reason"], note=event.get("resumed"))
                return out
            else:
                out["error"] = event.get("error")
                return out


async def until(predicate, timeout: float, what: str) -> None:
    """A bounded wait on a condition, without blocking the event loop."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        await asyncio.sleep(0.01)


def burst(stack, deployment: str = "pair", victim: int | None = None, sig=signal.SIGKILL, base=None, **params):
    """N concurrent requests; with `victim`, `sig` goes to that replica (SIGSTOP: once it has
    stopped) when every stream is placed, each of the victim's has KILL_AFTER pieces of text, and
    at least 3 of them are not yet half way (or, where the victim got fewer, every stream has
    KILL_AFTER pieces). Waiting for every stream to start let the victim's finish first under
    load. Returns the results in request order."""
    requests = [request(i, deployment, **params) for i in range(N)]
    streaming = [i for i, (kind, _) in enumerate(requests) if kind != "json"]
    progress = [0] * N
    seen: dict[int, int] = {}  # request -> its replica, once placed

    def time_to_signal() -> bool:
        if any(i not in seen for i in streaming):
            return False
        on_victim = [i for i in streaming if seen[i] == victim]
        if any(progress[i] < KILL_AFTER for i in on_victim):
            return False
        return sum(progress[i] < MAX_TOKENS // 2 for i in on_victim) >= 3 or all(
            progress[i] >= KILL_AFTER for i in streaming
        )

    async def main():
        headers = {"Authorization": f"Bearer {stack.key}"}
        async with httpx.AsyncClient(base_url=base or stack.base, headers=headers, timeout=60) as client:
            tasks = []
            for i, (kind, body) in enumerate(requests):
                if kind == "ws":
                    tasks.append(websocket(stack, body, progress, i, seen))
                elif kind == "json":
                    tasks.append(whole(client, body))
                else:
                    tasks.append(sse(client, kind, body, progress, i, seen))
            running = asyncio.gather(*tasks)
            if victim is not None:
                await until(time_to_signal, 30, "the victim's streams to be under way")
                if sig == signal.SIGSTOP:
                    await asyncio.to_thread(freeze, _pid(victim))
                else:
                    os.kill(_pid(victim), sig)
            results = await asyncio.wait_for(running, 60)
        for i, r in enumerate(results):
            r["kind"] = requests[i][0]
        return results

    return asyncio.run(main())


@pytest.fixture(scope="module")
def undisturbed(stack):
    serving(stack.deployments["pair"].pk, 2)
    results = burst(stack)
    assert all(r["error"] is None and r["note"] is None for r in results)
    assert all(r["usage"] is None or r["usage"]["completion_tokens"] == MAX_TOKENS for r in results)
    return results


def check_resumed(results, reference, victim: int, survivor: int) -> int:
    """Every request got the undisturbed answer, whole; those that moved say so, from the victim
    to the survivor (one the victim finished before the signal has no note: which ones did is a
    race the client cannot see, so only the answers are compared). Returns how many moved."""
    moved = 0
    for got, want in zip(results, reference, strict=True):
        assert got["error"] is None and got["last"] == "[DONE]", got
        assert got["text"] == want["text"]
        assert got.get("tokens") == want.get("tokens")
        for a, b in zip(got.get("logprobs", []), want.get("logprobs", []), strict=True):
            assert abs(a - b) < 1e-3
        assert got["finish"] == "length"
        if got["usage"] is not None:
            assert got["usage"]["completion_tokens"] == MAX_TOKENS
            assert got["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"]
        if got["note"]:
            [note] = got["note"]
            assert note["from_replica"] == victim == got["replica"] and note["to_replica"] == survivor
            assert 0 < note["after_tokens"] < MAX_TOKENS
            moved += 1
    return moved


# -- tests ---------------------------------------------------------------------------------------
def test_a_killed_replica_s_streams_resume_on_the_other_one_unchanged(stack, undisturbed):
    victim, survivor = serving(stack.deployments["pair"].pk, 2)
    counted = metric(stack.base, "switchyard_requests_resumed_total", deployment="pair")
    recorded_before = len(events("request.resumed", stack.deployments["pair"].pk))
    started = time.monotonic()
    results = burst(stack, victim=victim, sig=signal.SIGKILL)
    assert time.monotonic() - started < 45
    moved = check_resumed(results, undisturbed, victim, survivor)
    assert moved >= 3  # ~half the burst was on the victim, most of it mid-stream
    assert metric(stack.base, "switchyard_requests_resumed_total", deployment="pair") == counted + moved
    recorded = events("request.resumed", stack.deployments["pair"].pk)[recorded_before:]
    assert len(recorded) == moved and {e["from_replica"] for e in recorded} == {victim}


def test_a_stopped_replica_leaves_routing_and_its_streams_resume(stack, undisturbed):
    victim, survivor = serving(stack.deployments["pair"].pk, 2)
    pid = _pid(victim)
    try:
        results = burst(stack, victim=victim, sig=signal.SIGSTOP)
        check_resumed(results, undisturbed, victim, survivor)
        # Still stopped: its heartbeat goes stale (at once, when the burst had to wait for that to
        # move its streams; a little later when they had all ended before the signal), and new
        # requests go to the replica that heartbeats, none fails.
        wait_for(lambda: not _fresh(replica_status(victim)), 10, "the stopped replica's heartbeat to go stale")
        headers = {"Authorization": f"Bearer {stack.key}"}
        for _ in range(4):
            r = httpx.post(
                stack.base + "/v1/completions",
                headers=headers,
                timeout=30,
                json={"model": "pair", "prompt": "Hello", "max_tokens": 2},
            )
            assert r.status_code == 200 and r.headers["x-switchyard-replica"] == str(survivor)
    finally:
        os.kill(pid, signal.SIGCONT)
    # Woken up, it drops the requests that moved (the gateway told it to) and serves again. The
    # step it was frozen in ends first: a moved request one token from its end may finish there
    # (seen in a full run), so those that had half their tokens left are the ones checked.
    log = (stack.state / "logs" / f"replica-{victim}.log").read_text
    moved_ids = [r["id"] for r in results if r["note"] and r["note"][0]["after_tokens"] <= MAX_TOKENS // 2]
    wait_for(lambda: all(f"aborted {rid}" in log() for rid in moved_ids), 10, "the stale requests to be aborted")
    assert serving(stack.deployments["pair"].pk, 2) == [victim, survivor] and pid_alive(pid)


def test_a_seeded_sampled_request_resumed_draws_what_it_would_have(stack):
    serving(stack.deployments["pair"].pk, 2)
    body = {"model": "pair", "prompt": "Q: What is the capital of Peru?\nA:", "max_tokens": 3 * MAX_TOKENS,
            "ignore_eos": True, "temperature": 1.0, "seed": 4242, "top_k": 40, "frequency_penalty": 0.4,
            "logprobs": 2, "stream": True}  # fmt: skip

    async def one(kill: bool) -> dict:
        progress, seen = [0], {}
        headers = {"Authorization": f"Bearer {stack.key}"}
        async with httpx.AsyncClient(base_url=stack.base, headers=headers, timeout=60) as client:
            task = asyncio.ensure_future(sse(client, "completion", body, progress, 0, seen))
            if kill:
                await until(lambda: progress[0] >= 5, 30, "the stream to start")
                os.kill(_pid(seen[0]), signal.SIGKILL)
            return await asyncio.wait_for(task, 60)

    reference = asyncio.run(one(kill=False))
    resumed = asyncio.run(one(kill=True))
    assert resumed["note"] and resumed["note"][0]["from_replica"] == resumed["replica"]
    assert resumed["text"] == reference["text"] and resumed["tokens"] == reference["tokens"]
    assert max(abs(a - b) for a, b in zip(resumed["logprobs"], reference["logprobs"], strict=True)) < 1e-3
    assert resumed["finish"] == "length" and resumed["last"] == "[DONE]"


def _stream_until_killed(base: str, key: str, deployment: str, replica: int) -> tuple[list[str], float]:
    body = {"model": deployment, "prompt": "Hello", "max_tokens": 400, "ignore_eos": True, "stream": True}
    lines = []
    with httpx.stream(
        "POST", base + "/v1/completions", json=body, timeout=30, headers={"Authorization": f"Bearer {key}"}
    ) as r:
        assert r.status_code == 200 and r.headers["x-switchyard-replica"] == str(replica)
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line.removeprefix("data: "))
                if len(lines) == 3:
                    os.kill(_pid(replica), signal.SIGKILL)
                    killed = time.monotonic()
    return lines, time.monotonic() - killed


def test_with_no_other_replica_the_stream_ends_with_an_error_then_done(stack):
    [replica] = serving(stack.deployments["solo"].pk, 1)
    before = metric(stack.base, "switchyard_requests_failover_failed_total", deployment="solo")
    lines, seconds = _stream_until_killed(stack.base, stack.key, "solo", replica)
    assert lines[-1] == "[DONE]" and seconds < 10
    error = json.loads(lines[-2])["error"]
    assert error["code"] == "no_ready_replica" and f"replica {replica}" in error["message"]
    assert all("error" not in json.loads(line) for line in lines[:-2])
    assert metric(stack.base, "switchyard_requests_failover_failed_total", deployment="solo") == before + 1
    assert events("request.failover_failed", stack.deployments["solo"].pk)[-1]["from_replica"] == replica


def test_with_failover_off_a_lost_replica_ends_the_stream(stack, plain):
    victim, _ = serving(stack.deployments["pair"].pk, 2)
    # The plain web process routes by the same counts: send until the victim takes one.
    for _ in range(10):
        try:
            lines, _seconds = _stream_until_killed(plain, stack.key, "pair", victim)
            break
        except AssertionError:
            continue
    else:
        pytest.fail("no request reached the victim")
    assert lines[-1] == "[DONE]"
    assert json.loads(lines[-2])["error"]["code"] == "replica_error"


def test_a_stopped_only_replica_is_refused_with_retry_after_until_it_heartbeats(stack):
    [replica] = serving(stack.deployments["solo"].pk, 1)
    pid = _pid(replica)
    headers = {"Authorization": f"Bearer {stack.key}"}
    body = {"model": "solo", "prompt": "Hello", "max_tokens": 2}
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: not _fresh(replica_status(replica)), 10, "the heartbeat to go stale")
        r = httpx.post(stack.base + "/v1/completions", headers=headers, json=body, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_ready_replica"
        assert int(r.headers["Retry-After"]) > 0
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: _fresh(replica_status(replica)), 10, "the heartbeat to return")
    assert httpx.post(stack.base + "/v1/completions", headers=headers, json=body, timeout=30).status_code == 200


def test_a_draining_replica_s_refusal_sends_the_request_to_another(stack):
    """The router may pick a replica in the moment between its drain and its next heartbeat (up to
    0.5 s): it answers 503 and the request goes to another replica, not back to the client. That
    moment is made by stopping the draining replica (SIGSTOP) and writing its status as its last
    heartbeat before the drain had it (the one fake here: of timing, not of behaviour), and the
    other replica is made to look busier with requests counted against it."""
    from controlplane.deployments.models import Deployment
    from controlplane.gateway import generation
    from controlplane.gateway.hub import ReplicaHub
    from controlplane.gateway.routing.dispatched import dispatched_key

    draining, other = serving(stack.deployments["pair"].pk, 2)
    deployment = Deployment.objects.get(pk=stack.deployments["pair"].pk)
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    pid, busy = _pid(draining), {f"busy-{i}": float(client.time()[0]) + 60 for i in range(4)}
    params = protocol.WireSamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    message = protocol.GenerateMessage(prompt_token_ids=[5, 6, 7], params=params)

    async def main():
        hub = ReplicaHub(settings.REDIS_URL)
        # A long request keeps the draining replica alive while it drains.
        long = await hub.submit(
            draining, f"long-{uuid.uuid4().hex[:6]}", replace(message, params=replace(params, max_tokens=2000)), None
        )
        assert (await long.next_event()).TYPE == "accepted"
        os.kill(pid, signal.SIGTERM)
        await until(lambda: replica_status(draining).get("state") == "draining", 10, "the drain")
        try:
            freeze(pid)  # before its status is written for it: a running thread could still write its own
            idle = json.dumps({"running": 0, "waiting": 0})
            client.hset(
                protocol.status_key(draining),
                mapping={"state": "ready", "load": idle, "heartbeat": f"{time.time():.3f}"},
            )
            client.zadd(dispatched_key(other), busy)
            sent = client.xlen(protocol.requests_key(draining))
            candidates = {"decode": [draining, other], "prefill": []}
            placing = asyncio.ensure_future(
                generation._place(hub, deployment, candidates, message, lambda: f"t-{uuid.uuid4().hex}")
            )
            # Sent to the draining replica first (it is stopped: it answers once woken).
            await until(lambda: client.xlen(protocol.requests_key(draining)) > sent, 5, "the request to be sent")
        finally:
            os.kill(pid, signal.SIGCONT)
            client.zrem(dispatched_key(other), *busy)
        route, stream, first = await asyncio.wait_for(placing, 20)
        assert route.replica_id == other and first.TYPE == "accepted"
        while not stream.finished:
            last = await asyncio.wait_for(stream.next_event(), 10)
        await stream.close()
        await long.close()
        return last

    last = asyncio.run(main())
    assert last.finish_reason == "length" and last.usage["completion_tokens"] == 4


@pytest.fixture(scope="module")
def collector():
    with otlp_receiver() as received:
        yield received


def _attributes(span) -> dict:
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}


def test_a_disaggregated_request_that_failed_over_is_one_trace_with_each_replica_s_phases(stack, collector):
    """A request a prefill replica computed, streamed by a decode replica that is killed mid-way
    and resumed on the other: its trace, exported over OTLP, holds the first replica's queue,
    prefill, KV transfer and decode, the failover hop, then the second replica's queue, prefill and
    decode, in that order, under one root with the GenAI attributes."""
    endpoint, spans = collector
    serving(stack.deployments["pd-pair"].pk, 2, role="decode")
    body = {"model": "pd-pair", "messages": [{"role": "user", "content": "What is the capital of Peru?"}],
            "max_tokens": 2 * MAX_TOKENS, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip

    async def killed_mid_way(base: str) -> dict:
        progress, seen = [0], {}
        headers = {"Authorization": f"Bearer {stack.key}"}
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as client:
            task = asyncio.ensure_future(sse(client, "chat", body, progress, 0, seen))
            await until(lambda: progress[0] >= 5, 30, "the stream to start")
            os.kill(_pid(seen[0]), signal.SIGKILL)
            return await asyncio.wait_for(task, 60)

    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    with stack.web("web-traced", **env) as base:
        result = asyncio.run(killed_mid_way(base))
        assert result["error"] is None and result["usage"]["completion_tokens"] == 2 * MAX_TOKENS, result
        [note] = result["note"]
        victim, survivor, rid = note["from_replica"], note["to_replica"], result["id"]

        def trace():
            roots = [s for s in spans if not s.parent_span_id and _attributes(s).get("gen_ai.response.id") == rid]
            done = roots and sum(s.trace_id == roots[0].trace_id and s.name == "decode" for s in spans) == 2
            return roots[0] if done else None

        root = wait_for(trace, 10, "the trace of the request that moved")
    children = sorted(
        (s for s in spans if s.trace_id == root.trace_id and s.parent_span_id == root.span_id),
        key=lambda s: (s.start_time_unix_nano, s.end_time_unix_nano),
    )
    on = {r: {s.name: s for s in children if _attributes(s).get("switchyard.replica") == r} for r in (victim, survivor)}
    assert set(on[victim]) == {"queue", "prefill", "kv_transfer", "decode"}, [s.name for s in children]
    # The survivor prefills the prompt and the tokens so far itself (a prefill replica would not
    # know the output's part: seed positions, penalties), so no KV moves for it.
    assert set(on[survivor]) == {"queue", "prefill", "decode"}, [s.name for s in children]
    [hop] = [s for s in children if s.name == "failover"]
    hop_attrs = _attributes(hop)
    assert (hop_attrs["switchyard.from_replica"], hop_attrs["switchyard.to_replica"]) == (victim, survivor)
    assert hop_attrs["switchyard.after_tokens"] == note["after_tokens"] >= 5
    first, second = on[victim], on[survivor]
    # In order: each replica's queue, prefill and transfer end at its first token, where its decode
    # begins; the first decode ends when its replica is lost, where the hop begins.
    for phases in (first, second):
        assert phases["queue"].end_time_unix_nano == phases["prefill"].start_time_unix_nano
        assert phases["prefill"].end_time_unix_nano == phases["decode"].start_time_unix_nano
    assert first["kv_transfer"].end_time_unix_nano == first["decode"].start_time_unix_nano
    assert first["decode"].end_time_unix_nano == hop.start_time_unix_nano <= hop.end_time_unix_nano
    assert hop.end_time_unix_nano <= second["decode"].start_time_unix_nano <= root.end_time_unix_nano
    assert root.start_time_unix_nano <= first["queue"].start_time_unix_nano
    root_attrs = _attributes(root)
    assert root_attrs["gen_ai.request.model"] == "pd-pair"
    assert root_attrs["gen_ai.usage.output_tokens"] == 2 * MAX_TOKENS
    assert root_attrs["gen_ai.usage.input_tokens"] == result["usage"]["prompt_tokens"]
