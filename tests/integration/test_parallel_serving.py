"""A tensor-parallel deployment through the whole stack: created over the REST API on a node
with two CPU devices (CPU_DEVICES=2), placed with one device per rank, serving the official
`openai` client with the tokens the single-device engine gives."""

from __future__ import annotations

import uuid

import openai
import psutil
import pytest

from tests.support.stack import demo_model, processes, stack_env, wait_for, wait_online, wait_ready, wait_web
from workers.bench.processes import free_port
from workers.demo import MODEL_DIR

# transaction=True: what the test writes is for the stack's processes to read.
pytestmark = [pytest.mark.timeout(600), pytest.mark.django_db(transaction=True)]


def test_a_tp2_deployment_serves_the_openai_client(tmp_path):
    from django.contrib.auth import get_user_model
    from django.test import Client

    from controlplane.deployments.models import Replica
    from controlplane.gateway.services import create_api_key
    from workers.engine import LLM, SamplingParams

    node, port = f"tp-{uuid.uuid4().hex[:6]}", free_port()
    env = stack_env(tmp_path, REPLICA_CPU_THREADS="1", CPU_DEVICES="2")
    owner = get_user_model().objects.create_user("tp-owner", is_staff=True)
    demo_model("tp-model")
    _, key = create_api_key(name="tp", owner=owner)
    api = Client()
    api.force_login(owner)
    with processes(tmp_path, node, env, web_port=port):
        wait_online(node)
        created = api.post(
            "/api/v1/deployments/",
            {"slug": "tp", "model": "tp-model", "replicas": 1, "tensor_parallel": 2, "dtype": "float32"},
            content_type="application/json",
        )
        assert created.status_code == 201, created.json()
        refused = api.post(
            "/api/v1/deployments/",
            {"slug": "tp4", "model": "tp-model", "tensor_parallel": 4},
            content_type="application/json",
        )
        assert refused.status_code == 400
        assert "needs 4 devices on one node" in refused.json()["tensor_parallel"][0]

        [replica] = wait_ready("tp", 1, 240)
        shown = api.get(f"/api/v1/replicas/{replica.pk}/").json()
        assert shown["ranks"] == [{"rank": 0, "device": "cpu:0"}, {"rank": 1, "device": "cpu:1"}]
        # Each rank reported its memory: about half the weights each.
        load = wait_for(lambda: api.get(f"/api/v1/replicas/{replica.pk}/").json()["load"], 30, "the replica's load")
        assert [m["rank"] for m in load["rank_memory"]] == [0, 1]
        assert all(m["weights"] > 0 and m["kv_cache"] > 0 for m in load["rank_memory"])

        base = f"http://127.0.0.1:{port}"
        wait_web(base)
        client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)
        reply = client.completions.create(model="tp", prompt="The capital of Japan is", max_tokens=8, temperature=0)
        single = LLM(str(MODEL_DIR), dtype="float32").generate(
            "The capital of Japan is", SamplingParams(max_tokens=8, temperature=0)
        )[0]
        assert reply.choices[0].text == single.outputs[0].text
        assert reply.usage.completion_tokens == len(single.outputs[0].token_ids)

        # Rank 1 (rank 0's child) dies: the replica exits and the agent restarts the group.
        [rank1] = [p for p in psutil.Process(replica.pid).children() if "resource_tracker" not in " ".join(p.cmdline())]
        rank1.kill()
        restarted = wait_for(
            lambda: Replica.objects.filter(deployment__slug="tp", state="ready", restart_count__gte=1).first(),
            240,
            "the group restarted",
        )
        assert not psutil.pid_exists(rank1.pid) or rank1.status() == psutil.STATUS_ZOMBIE
        assert not psutil.pid_exists(replica.pid) or restarted.pid != replica.pid
        again = client.completions.create(model="tp", prompt="The capital of Japan is", max_tokens=8, temperature=0)
        assert again.choices[0].text == single.outputs[0].text
