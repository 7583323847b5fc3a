"""A deployment of the simulated engine (`engine: sim`) through the whole platform: the control
worker places its replicas, the node agent starts them from their specs, the gateway routes
OpenAI requests to them. They become ready without loading torch, answer concurrent and streamed
requests, give the same answer to the same prompt on whichever replica serves it, and report load
as real replicas do."""

from __future__ import annotations

import concurrent.futures
import json
import uuid
from pathlib import Path

import openai
import pytest

from tests.support.stack import (
    demo_model,
    processes,
    replica_load,
    replica_status,
    stack_env,
    wait_for,
    wait_online,
    wait_ready,
)
from workers.bench.processes import free_port

pytestmark = [pytest.mark.timeout(240), pytest.mark.django_db(transaction=True)]
REPLICAS = 4
CONTEXT = " Explain how requests are routed between replicas, and why." * 4  # full KV blocks to reuse


def test_a_simulated_deployment_serves_through_the_gateway(tmp_path):
    from django.contrib.auth import get_user_model

    from controlplane.deployments.services import create_deployment
    from controlplane.gateway.services import create_api_key

    node, port = f"sim-{uuid.uuid4().hex[:4]}", free_port()
    env = stack_env(tmp_path, CPU_REPLICAS_PER_DEVICE=str(REPLICAS), REPLICA_CPU_THREADS="1")
    owner = get_user_model().objects.create_user("sim", is_staff=True)
    model = demo_model()
    _, key = create_api_key(name="k", owner=owner)
    with processes(tmp_path, node, env, web_port=port):
        wait_online(node)
        create_deployment({"slug": "sim", "model": model, "replicas": REPLICAS, "engine": "sim", "max_num_seqs": 16})
        replicas = wait_ready("sim", REPLICAS, 90)
        for replica in replicas:  # the simulated engine's process: no torch mapped into it
            maps = Path(f"/proc/{replica.pid}/maps").read_text()
            assert "libtorch" not in maps, replica.pid

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=60)

        def ask(i: int):
            return client.chat.completions.create(
                model="sim",
                messages=[{"role": "user", "content": f"question {i % 5}{CONTEXT}"}],
                max_tokens=12,
                temperature=0,
            )

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(ask, range(40)))
        assert all(a.choices[0].message.content and a.usage.completion_tokens <= 12 for a in answers)
        by_question: dict[int, set[str]] = {}
        for i, answer in enumerate(answers):
            by_question.setdefault(i % 5, set()).add(answer.choices[0].message.content)
        assert all(len(texts) == 1 for texts in by_question.values()), by_question  # same prompt, same answer
        assert len({next(iter(texts)) for texts in by_question.values()}) == 5

        stream = client.chat.completions.create(
            model="sim",
            messages=[{"role": "user", "content": f"question 0{CONTEXT}"}],
            max_tokens=12,
            temperature=0,
            stream=True,
        )
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        assert streamed == next(iter(by_question[0]))

        def finished() -> int | None:  # every request counted once, over the replicas' heartbeats
            counts = [
                json.loads(replica_status(r.pk).get("metrics") or "{}").get("requests_finished", 0) for r in replicas
            ]
            return sum(counts) if sum(counts) == 41 else None

        wait_for(finished, 10, "the replicas' heartbeats to count the 41 requests")
        loads = [replica_load(r.pk) for r in replicas]
        assert all(load["kv_blocks_total"] > 0 and load["running"] == 0 for load in loads)
        assert sum(load["prefix_cache_hits"] for load in loads) > 0  # five prompts, asked eight times each
