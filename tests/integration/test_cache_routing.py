"""Prompt-cache routing through real processes (uvicorn, the control worker, a node agent, two
replicas of the demo model): identical prompts meet their cached prefix, a session's turns stay
on its replica with growing cached tokens, the KV-aware router finds a prefix without any
header, the gateway's prediction matches what the engine reports, and a replica that dies
leaves the index and its sessions move. Prompts are token ids (completions), so the gateway
has them whatever the model's template."""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest
import redis
from django.conf import settings

from tests.support.platform import platform
from tests.support.stack import replica_load, replica_status, wait_for, wait_ready
from workers.protocol import kv_blocks

pytestmark = [pytest.mark.timeout(300), pytest.mark.django_db]
B = 16  # the deployment's KV block size (no cache policy: the default)


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory):
    cached = {"slug": "cached", "replicas": 2}
    with platform(django_db_blocker, tmp_path_factory, "cache", deployments=[cached]) as p, p.http() as http:
        yield http


def complete(http: httpx.Client, prompt: list[int], session: str | None = None) -> tuple[dict, httpx.Headers]:
    headers = {"x-session-affinity": session} if session else {}
    body = {"model": "cached", "prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    response = http.post("/v1/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["usage"], response.headers


def cached(usage: dict) -> int:
    return usage["prompt_tokens_details"]["cached_tokens"]


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 1000 + 5 for i in range(n)]


def test_identical_prompts_report_the_oracles_cached_tokens(stack):
    # 300 tokens: 18 whole blocks of 16 the engine can reuse (it computes the last token); more
    # than LOAD_BLOCKS, so a heartbeat still reporting the previous request in flight cannot send
    # the next one away from its prefix (3 blocks could: one fresh-clone run cached 96, not 144).
    p, n = 300, 4
    results = [complete(stack, prompt(1, p)) for _ in range(n)]
    assert sum(cached(usage) for usage, _ in results) == (n - 1) * (p // B) * B
    assert len({headers["x-switchyard-replica"] for _, headers in results}) == 1  # the prefix's replica
    assert [headers["x-switchyard-route-reason"] for _, headers in results[1:]] == ["kv_aware"] * (n - 1)
    # the gateway's prediction is what the engine then reported
    assert [int(headers["x-switchyard-cached-tokens-predicted"]) for _, headers in results] == [
        cached(usage) for usage, _ in results
    ]


def test_a_sessions_turns_stay_on_its_replica_with_growing_cached_tokens(stack):
    context, seen = prompt(2, 40), []
    for turn in range(5):
        usage, headers = complete(stack, context, session="agent-7")
        seen.append((headers["x-switchyard-replica"], cached(usage)))
        if turn:
            assert headers["x-switchyard-route-reason"] == "session_bound"
        context = context + prompt(100 + turn, 24)  # the tool result of this turn
    assert len({replica for replica, _ in seen}) == 1
    tokens = [n for _, n in seen]
    assert tokens[0] == 0 and tokens == sorted(set(tokens)), tokens


def test_without_a_header_the_kv_aware_router_follows_each_prefix(stack):
    # Two conversations with different prefixes, interleaved: each one's turns go to the replica
    # holding its prefix. 400 tokens (25 blocks) outweigh a request the previous turn's replica may
    # still report in flight (a heartbeat lags up to 0.5 s; one request weighs LOAD_BLOCKS = 16):
    # with 64 tokens a late heartbeat could send a turn to the other replica. On a loaded machine
    # heartbeats lag longer (a run with three test processes sent a fourth turn away), so each
    # turn waits until its replica reports nothing in flight: the test is of prefixes, not load.
    # The module's earlier tests sent their requests to one replica within RECENT_SECONDS: a
    # replica sent too many lately has a continued conversation moved (policies.py's rebalance,
    # tested in test_routing_policies), which is not what this test is about, so the router's
    # recent-request counts start empty.
    client = redis.Redis.from_url(settings.REDIS_URL)
    recent = list(client.scan_iter(match="switchyard:*recent*"))
    if recent:
        client.delete(*recent)
    contexts = {"a": prompt(3, 400), "b": prompt(4, 400)}
    homes: dict[str, set] = {"a": set(), "b": set()}
    for turn in range(4):
        for name in contexts:
            usage, headers = complete(stack, contexts[name])
            home = int(headers["x-switchyard-replica"])
            homes[name].add(home)
            idle = lambda home=home: replica_load(home).get("running") == 0 == replica_load(home).get("waiting")  # noqa: E731
            wait_for(idle, 10, f"replica {home} to report no request in flight")
            if turn:
                why = dict(turn=turn, name=name, homes=homes, headers=dict(headers), usage=usage)
                assert cached(usage) >= 400 // B * B and headers["x-switchyard-route-reason"] == "kv_aware", why
            contexts[name] = contexts[name] + prompt(200 + turn, 20)
    assert all(len(replicas) == 1 for replicas in homes.values()), homes


def test_a_replica_that_dies_leaves_the_index_and_its_sessions_move(stack):
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    context = prompt(5, 48)
    usage, headers = complete(stack, context, session="doomed")
    home = int(headers["x-switchyard-replica"])
    assert client.scard(kv_blocks.kv_index_key(home)) > 0
    os.kill(json.loads(replica_status(home)["endpoint"])["pid"], signal.SIGKILL)
    # the agent sees the process go and drops its blocks from the index
    wait_for(lambda: client.exists(kv_blocks.kv_index_key(home)) == 0, 30, "the dead replica's index to go")
    usage, headers = complete(stack, context + prompt(300, 16), session="doomed")
    moved = int(headers["x-switchyard-replica"])
    assert moved != home and "session" in headers["x-switchyard-route-reason"]
    usage, headers = complete(stack, context + prompt(300, 16) + prompt(301, 16), session="doomed")
    assert int(headers["x-switchyard-replica"]) == moved and headers["x-switchyard-route-reason"] == "session_bound"
    assert cached(usage) > 0
    wait_ready("cached", 2, 120)  # restarted by its agent: the module leaves the stack whole
