"""The autoscaler on a running platform: a simulated deployment (engine sim, workers/sim) under a
step of load scales up while requests queue, holds at its maximum, and once the load stops scales
down one replica at a time after the cooldown, back to its minimum; every request of the load
succeeds. Beat runs the autoscaler every 2 s here (AUTOSCALE_INTERVAL)."""

from __future__ import annotations

import threading
import uuid

import openai
import pytest

from tests.support.stack import demo_model, processes, stack_env, wait_for, wait_online, wait_ready
from workers.bench.processes import free_port

pytestmark = [pytest.mark.timeout(300), pytest.mark.django_db(transaction=True)]
COOLDOWN = 6


def test_a_step_of_load_scales_a_simulated_deployment_up_then_down_after_the_cooldown(tmp_path):
    from django.contrib.auth import get_user_model

    from controlplane.autoscaling.models import Autoscaling
    from controlplane.deployments.models import Deployment
    from controlplane.deployments.services import create_deployment
    from controlplane.events.models import Event
    from controlplane.gateway.services import create_api_key

    node, port = f"auto-{uuid.uuid4().hex[:4]}", free_port()
    env = stack_env(
        tmp_path, CPU_REPLICAS_PER_DEVICE="4", AUTOSCALE_INTERVAL="2", TELEMETRY_INTERVAL="1", RECONCILE_INTERVAL="2"
    )
    owner = get_user_model().objects.create_user("auto", is_staff=True)
    _, key = create_api_key(name="k", owner=owner)
    model = demo_model()
    with processes(tmp_path, node, env, web_port=port, beat=True):
        wait_online(node)
        # Two sequences at a time per replica: twelve clients keep requests waiting on one.
        dep = create_deployment({"slug": "auto", "model": model, "replicas": 1, "engine": "sim", "max_num_seqs": 2})
        Autoscaling.objects.create(deployment=dep, enabled=True, mode="active", min_replicas=1, max_replicas=3,
                                   scale_down_cooldown_seconds=COOLDOWN, itl_p90_ms=1000,
                                   ttft_p90_ms=60_000)  # fmt: skip
        wait_ready("auto", 1, 60)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=120)
        stop_load, results, errors = threading.Event(), [], []

        def load(i: int) -> None:
            while not stop_load.is_set():
                try:
                    answer = client.chat.completions.create(
                        model="auto",
                        messages=[{"role": "user", "content": f"client {i}"}],
                        max_tokens=48,
                        extra_body={"ignore_eos": True},
                    )
                    results.append(answer.usage.completion_tokens)
                except Exception as exc:  # every failure is reported below
                    errors.append(repr(exc))

        clients = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(12)]
        for thread in clients:
            thread.start()
        try:
            wait_for(lambda: Deployment.objects.get(slug="auto").replicas == 3, 90, "the autoscaler to reach 3")
            wait_ready("auto", 3, 60)
        finally:
            stop_load.set()
            for thread in clients:
                thread.join(timeout=150)
        assert not errors, errors[:3]
        assert results and all(tokens == 48 for tokens in results)

        wait_for(lambda: Deployment.objects.get(slug="auto").replicas == 1, 90, "the autoscaler to come back to 1")
        wait_ready("auto", 1, 60)
        scaled = list(Event.objects.filter(verb="autoscaling.scaled").order_by("id"))
        steps = [(e.data["from"], e.data["decision"]["replicas"], e.data["decision"]["rule"]) for e in scaled]
        ups = [s for s in steps if s[1] > s[0]]
        downs = [s for s in steps if s[1] < s[0]]
        assert ups and all(rule == "burst" for _, _, rule in ups), steps
        assert downs == [(3, 2, "down"), (2, 1, "down")], steps  # one at a time
