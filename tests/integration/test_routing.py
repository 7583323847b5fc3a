"""Routing through real processes (uvicorn, the control worker, a node agent and replica
processes on the demo model): a burst spreads over the ready replicas, the gateway's count of
requests in flight never leaks, and `x-switchyard-prefill-replica` names a prefill replica only
when one really computed the prompt."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import httpx
import pytest
import redis
from django.conf import settings

from tests.support.platform import platform
from tests.support.stack import replica_load, wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.django_db]
LOCAL_PREFILL_TOKENS = 64  # the PD deployment's decode replica prefills shorter prompts itself
BURST, TRIALS = 8, 5


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory):
    spread = {"slug": "spread", "replicas": 2}
    pd = {"slug": "pd", "mode": "disaggregated", "replicas": 0, "prefill_replicas": 1, "decode_replicas": 1}
    env = {"PD_LOCAL_PREFILL_TOKENS": str(LOCAL_PREFILL_TOKENS)}
    with platform(django_db_blocker, tmp_path_factory, "routing", deployments=[spread, pd], env=env) as p:
        yield p


def _dispatched(replica_id: int) -> int:
    from controlplane.gateway.routing.dispatched import dispatched_key

    return redis.Redis.from_url(settings.REDIS_URL).zcard(dispatched_key(replica_id))


def _idle(replica_ids) -> bool:
    return all(replica_load(r).get("running") == 0 and replica_load(r).get("waiting") == 0 for r in replica_ids)


async def _burst(stack, n: int) -> list[httpx.Response]:
    body = {"model": "spread", "prompt": "Hello", "max_tokens": 48, "ignore_eos": True, "temperature": 0}
    headers = {"Authorization": f"Bearer {stack.key}"}
    async with httpx.AsyncClient(base_url=stack.base, headers=headers, timeout=60) as client:
        return await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(n)))


def test_a_burst_spreads_over_the_idle_replicas(stack):
    replicas = sorted(r.id for r in stack.replicas["spread"])
    splits = []
    for _ in range(TRIALS):
        wait_for(lambda: _idle(replicas), 10, "both replicas to be idle")
        responses = asyncio.run(_burst(stack, BURST))
        assert [r.status_code for r in responses] == [200] * BURST, [r.text for r in responses if r.is_error]
        counts = Counter(int(r.headers["x-switchyard-replica"]) for r in responses)
        splits.append(tuple(counts[r] for r in replicas))
        # Every request has ended: none is still counted against its replica.
        assert [_dispatched(r) for r in replicas] == [0, 0]
    assert all(abs(a - b) <= 2 for a, b in splits), splits  # 4/4 ± 1


def test_an_abandoned_request_is_not_counted_once_the_client_has_gone(stack):
    replicas = sorted(r.id for r in stack.replicas["spread"])
    body = {"model": "spread", "prompt": "Hello", "max_tokens": 400, "ignore_eos": True, "stream": True}
    headers = {"Authorization": f"Bearer {stack.key}"}
    with httpx.stream("POST", stack.base + "/v1/completions", json=body, headers=headers, timeout=30) as r:
        replica = int(r.headers["x-switchyard-replica"])
        lines = r.iter_lines()  # kept: a dropped iterator closes the connection at once
        next(lines)
        assert _dispatched(replica) == 1
    wait_for(lambda: _dispatched(replica) == 0, 5, "the abandoned request to be uncounted")
    assert [_dispatched(r) for r in replicas] == [0, 0]


def _pd_completion(stack, prompt: list[int], stream: bool) -> tuple[httpx.Response, list[dict]]:
    body = {"model": "pd", "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": stream}
    response = httpx.post(
        stack.base + "/v1/completions", json=body, timeout=30, headers={"Authorization": f"Bearer {stack.key}"}
    )
    assert response.status_code == 200, response.text
    if not stream:
        return response, [response.json()]
    chunks = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    return response, [json.loads(c) for c in chunks[:-1]]


def test_the_prefill_header_names_a_prefill_replica_only_when_it_computed_the_prompt(stack):
    roles = {r.role: r.id for r in stack.replicas["pd"]}
    short = list(range(20, 20 + LOCAL_PREFILL_TOKENS // 2))  # prefilled by the decode replica itself
    long = list(range(20, 20 + LOCAL_PREFILL_TOKENS * 2))  # handed to the prefill replica
    for stream in (False, True):
        response, chunks = _pd_completion(stack, short, stream)
        assert response.headers["x-switchyard-replica"] == str(roles["decode"])
        assert "x-switchyard-prefill-replica" not in response.headers
        if stream:  # the last chunk says who computed the prompt: nobody but the decode replica
            assert chunks[-1]["x_switchyard"] == {"prefill_replica": None}

        response, chunks = _pd_completion(stack, long, stream)
        assert response.headers["x-switchyard-prefill-replica"] == str(roles["prefill"])
        if stream:
            assert chunks[-1]["x_switchyard"] == {"prefill_replica": roles["prefill"]}
    handoffs = replica_load(roles["decode"])["kv_transfer"]
    assert handoffs["fallbacks"] == 0
