"""Two node agents on this machine, as two machines would run them: each with its own node
name, state directory and `cpu` device, the control plane reaching both through Celery and
Redis only. A 2-replica deployment lands one replica per node; a disaggregated deployment's
prefill and decode replicas on different nodes move KV over Mooncake TCP between them; an agent
that stops has its replicas moved to the other node."""

from __future__ import annotations

import signal
import uuid

import openai
import pytest

from tests.support.stack import demo_model, processes, replica_load, stack_env, start_agent, stop, wait_for, wait_ready
from workers.bench.processes import free_port

pytestmark = [pytest.mark.timeout(300), pytest.mark.django_db(transaction=True)]


def test_two_nodes_spread_replicas_move_kv_between_them_and_take_over(tmp_path):
    from django.contrib.auth import get_user_model

    from controlplane.deployments.models import Replica
    from controlplane.deployments.services import create_deployment
    from controlplane.gateway.services import create_api_key
    from controlplane.inventory.models import Node

    node_a, node_b = f"node-a-{uuid.uuid4().hex[:4]}", f"node-b-{uuid.uuid4().hex[:4]}"
    port = free_port()
    env = stack_env(tmp_path / "a", REPLICA_CPU_THREADS="1", PD_LOCAL_PREFILL_TOKENS="0", CPU_REPLICAS_PER_DEVICE="4")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # Node b: its own state directory (logs, specs) as on another machine.
    env_b = {**env, "SWITCHYARD_STATE_DIR": str(tmp_path / "b"), "KV_TRANSFER_HOST": "127.0.0.1"}
    owner = get_user_model().objects.create_user("two-nodes", is_staff=True)
    model = demo_model()
    _, key = create_api_key(name="k", owner=owner)
    with processes(tmp_path / "a", node_a, env, web_port=port):
        agent_b, agent_b_log = start_agent(tmp_path / "b", node_b, env_b)
        try:
            wait_for(lambda: Node.objects.filter(status="online").count() == 2, 60, "both agents to register")

            spread = create_deployment({"slug": "spread", "model": model, "replicas": 2, "max_num_seqs": 8})
            ready = wait_ready("spread", 2, 120)
            assert {r.node.name for r in ready} == {node_a, node_b}

            pd = create_deployment(
                {"slug": "pd", "model": model, "mode": "disaggregated", "prefill_replicas": 1,
                 "decode_replicas": 1, "replicas": 0, "max_num_seqs": 8}
            )  # fmt: skip
            roles = {r.role: r for r in wait_ready("pd", 2, 120)}
            assert roles["prefill"].node.name != roles["decode"].node.name

            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=60)
            prompt = "<|user|>What is the capital of Peru?<|end|>\n<|assistant|>"
            raw = client.completions.with_raw_response.create(model="pd", prompt=prompt, temperature=0, max_tokens=8)
            assert raw.headers["x-switchyard-prefill-replica"] == str(roles["prefill"].pk)
            assert raw.headers["x-switchyard-replica"] == str(roles["decode"].pk)
            assert "Lima" in raw.parse().choices[0].text
            # The decode replica received the prompt's KV blocks from the other node.
            transfer = wait_for(
                lambda: replica_load(roles["decode"].pk).get("kv_transfer", {}).get("handoffs"), 10, "a handoff"
            )
            assert transfer >= 1 and replica_load(roles["decode"].pk)["kv_transfer"]["fallbacks"] == 0

            # Node b's agent stops: its replicas drain, and their replacements start on node a.
            on_b = set(Replica.objects.filter(node__name=node_b, state="ready").values_list("pk", flat=True))
            assert on_b
            agent_b.send_signal(signal.SIGTERM)
            agent_b.wait(timeout=60)
            wait_for(lambda: Node.objects.get(name=node_b).status == "offline", 30, "node b to go offline")
            wait_for(
                lambda: Replica.objects.filter(pk__in=on_b, state="stopped").count() == len(on_b),
                60,
                "node b's replicas to stop",
            )

            def all_on_a():
                live = Replica.objects.filter(deployment__in=[spread, pd], state="ready")
                return live.count() == 4 and {r.node.name for r in live} == {node_a}

            wait_for(all_on_a, 150, "every replica to run on node a")
            assert (
                "Lima"
                in client.completions.create(model="pd", prompt=prompt, temperature=0, max_tokens=8).choices[0].text
            )
            assert not Replica.objects.filter(state="failed").exists()
        finally:
            stop([agent_b], [agent_b_log])
