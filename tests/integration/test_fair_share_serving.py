"""Fair sharing between tenants through the whole platform: two API key owners share a replica
that serves one request at a time; one sends a burst of eight, the other two just after. With
fair sharing (the default) the light tenant's requests go ahead of most of the burst; with
`fair_share: false` they wait behind all of it. `/metrics` counts each tenant's tokens, equal to
the sums of the `usage` its requests got. The simulated engine runs the real scheduler."""

from __future__ import annotations

import concurrent.futures
import uuid

import openai
import pytest

from tests.support.stack import (
    demo_model,
    processes,
    replica_load,
    sample_sum,
    scrape,
    stack_env,
    wait_for,
    wait_online,
    wait_ready,
)
from workers.bench.processes import free_port

pytestmark = [pytest.mark.timeout(240), pytest.mark.django_db(transaction=True)]
BURST = 8


def finish_order(base: str, keys: dict[str, str], slug: str, replica_id: int) -> tuple[list[str], dict]:
    """Send the heavy tenant's burst, wait until the replica queues it, then the light tenant's
    two; returns which tenant each answer went to, in the order they finished, and the usage
    each tenant got."""
    clients = {
        tenant: openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)
        for tenant, key in keys.items()
    }
    order: list[str] = []
    usage: dict[str, list[int]] = {tenant: [0, 0] for tenant in keys}

    def ask(tenant: str, i: int) -> None:
        answer = clients[tenant].chat.completions.create(
            model=slug, messages=[{"role": "user", "content": f"{tenant} {i}"}], max_tokens=16, temperature=0
        )
        order.append(tenant)  # list.append is atomic: the order answers came back in
        usage[tenant][0] += answer.usage.prompt_tokens
        usage[tenant][1] += answer.usage.completion_tokens

    with concurrent.futures.ThreadPoolExecutor(BURST + 2) as pool:
        heavy = [pool.submit(ask, "heavy", i) for i in range(BURST)]
        wait_for(lambda: replica_load(replica_id).get("waiting", 0) >= BURST - 2, 20, "the burst to queue")
        light = [pool.submit(ask, "light", i) for i in range(2)]
        for future in heavy + light:
            future.result()
    return order, usage


def test_a_light_tenant_is_not_starved_by_a_heavy_ones_burst(tmp_path):
    from django.contrib.auth import get_user_model

    from controlplane.deployments.services import create_deployment
    from controlplane.gateway.services import create_api_key

    node, port = f"fair-{uuid.uuid4().hex[:4]}", free_port()
    base = f"http://127.0.0.1:{port}"
    # bench-slow: steps slow enough that the burst is still queued when the light tenant asks
    env = stack_env(tmp_path, CPU_REPLICAS_PER_DEVICE="2", REPLICA_CPU_THREADS="1")
    users = get_user_model().objects
    keys = {tenant: create_api_key(name=tenant, owner=users.create_user(tenant))[1] for tenant in ("heavy", "light")}
    model = demo_model()
    with processes(tmp_path, node, env, web_port=port):
        wait_online(node)
        for slug, fair in (("fair", True), ("fifo", False)):
            create_deployment({"slug": slug, "model": model, "replicas": 1, "engine": "sim", "max_num_seqs": 1,
                               "sim_profile": "bench-slow", "fair_share": fair})  # fmt: skip
        replicas = {slug: wait_ready(slug, 1, 90)[0] for slug in ("fair", "fifo")}

        fifo, _ = finish_order(base, keys, "fifo", replicas["fifo"].pk)
        fair, usage = finish_order(base, keys, "fair", replicas["fair"].pk)
        # First come, first served: the light tenant's answers come after the whole burst, but
        # for the request that was running when they arrived.
        assert fifo.index("light") >= BURST - 1, fifo
        # Fair: both of its answers within the first few (the burst's first requests were
        # admitted before the light tenant existed, one at a time).
        assert max(i for i, t in enumerate(fair) if t == "light") <= 4, fair

        def counted():
            samples = scrape(base)
            got = {
                tenant: [
                    sample_sum(samples, f"switchyard_tenant_{kind}_tokens_total", deployment="fair", tenant=tenant)
                    for kind in ("prompt", "generation")
                ]
                for tenant in keys
            }
            return got if got == usage else None

        wait_for(counted, 10, f"/metrics to count each tenant's tokens as their usage said: {usage}")
