"""The Batch API through the whole platform, driven by the official `openai` client: a file of
requests uploaded, a batch created, its lines sent by the control worker's dispatcher to
simulated replicas, the output file read back. Then the same while a replica is killed and the
control worker is killed (and started again, as its supervisor would): the output still holds
every custom_id exactly once, each with the answer its own request gets alone; and again when
the web process is killed mid-batch and started again, and when Redis is (the stack's own
redis-server: it comes back empty)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import uuid
from contextlib import contextmanager

import openai
import pytest

from tests.support.stack import (
    demo_model,
    pid_alive,
    processes,
    stack_env,
    start_web,
    stop,
    wait_for,
    wait_online,
    wait_ready,
    wait_web,
)
from workers.bench.processes import ROOT, RedisServer, free_port

pytestmark = [pytest.mark.timeout(300), pytest.mark.django_db(transaction=True)]
MAX_TOKENS = 12


def requests(n: int) -> bytes:
    lines = [
        {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "sim", "messages": [{"role": "user", "content": f"Summarise document {i}."}],
                  "max_tokens": MAX_TOKENS, "temperature": 0}}
        for i in range(n)
    ]  # fmt: skip
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def run_batch(client: openai.OpenAI, n: int):
    f = client.files.create(file=("docs.jsonl", io.BytesIO(requests(n))), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "in_progress" and batch.request_counts.total == n
    return batch


def finished(client: openai.OpenAI, batch_id: str, timeout: float):
    def done():
        try:
            batch = client.batches.retrieve(batch_id)
        except openai.APIConnectionError:  # the web process is being restarted
            return None
        return batch if batch.status in ("completed", "failed", "expired", "cancelled") else None

    return wait_for(done, timeout, f"batch {batch_id} to end", interval=0.5)


def check_output(client: openai.OpenAI, batch, n: int, alone: dict[int, str]) -> None:
    """Every custom_id once, answered 200, with the text its request gets alone."""
    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (n, 0), batch.request_counts
    assert batch.error_file_id is None
    rows = [json.loads(row) for row in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(row["custom_id"] for row in rows) == sorted(f"line-{i}" for i in range(n))
    for row in rows:
        i = int(row["custom_id"].removeprefix("line-"))
        assert row["error"] is None and row["response"]["status_code"] == 200, row
        body = row["response"]["body"]
        assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] <= MAX_TOKENS
        if i in alone:
            assert body["choices"][0]["message"]["content"] == alone[i], row


@contextmanager
def broker_stopped(broker: RedisServer):
    """Stops the stack's redis-server when the stack has stopped."""
    try:
        yield broker
    finally:
        broker.kill()


def test_a_batch_survives_a_replica_the_control_worker_the_web_and_redis_being_killed(tmp_path):
    from django.contrib.auth import get_user_model

    from controlplane.batches.models import BatchLine
    from controlplane.deployments.models import Replica
    from controlplane.deployments.services import create_deployment
    from controlplane.gateway.services import create_api_key

    node, port = f"batch-{uuid.uuid4().hex[:4]}", free_port()
    broker = RedisServer(cwd=tmp_path)  # its own, to restart
    broker.start()
    env = stack_env(
        tmp_path,
        CPU_REPLICAS_PER_DEVICE="2",
        REPLICA_CPU_THREADS="1",
        BATCH_DISPATCH_INTERVAL="1",
        REDIS_URL=broker.url,
    )
    _, key = create_api_key(name="k", owner=get_user_model().objects.create_user("batch-owner"))
    with broker_stopped(broker), processes(tmp_path, node, env, web_port=port, beat=True) as procs:
        wait_online(node)
        create_deployment({"slug": "sim", "model": demo_model(), "replicas": 2, "engine": "sim", "max_num_seqs": 8})
        wait_ready("sim", 2, 90)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=60)
        alone = {
            i: client.chat.completions.create(
                model="sim",
                messages=[{"role": "user", "content": f"Summarise document {i}."}],
                max_tokens=MAX_TOKENS,
                temperature=0,
            )
            .choices[0]
            .message.content
            for i in (0, 7, 29)
        }

        # 1. A plain batch.
        batch = finished(client, run_batch(client, 12).id, 60)
        check_output(client, batch, 12, alone)

        # 2. A replica and the control worker killed mid-batch.
        n = 120
        batch = run_batch(client, n)
        lines = BatchLine.objects.filter(batch_id=batch.id)
        # Killed while lines are in flight, some answered already.
        wait_for(
            lambda: lines.filter(state="done").count() >= 10 and lines.filter(state="sent").exists(),
            60,
            "10 lines answered and more in flight",
            interval=0.05,
        )
        victim = Replica.objects.filter(deployment__slug="sim", state="ready").order_by("id").first()
        os.kill(victim.pid, signal.SIGKILL)
        control = procs[0]  # processes() starts the control worker first
        os.kill(control.pid, signal.SIGKILL)
        control.wait(10)
        # Its supervisor starts it again (make run, systemd and Kubernetes all do).
        with open(tmp_path / "control-2.log", "wb") as log:
            again = subprocess.Popen(
                control.args,
                cwd=ROOT,
                env={**env, "GATEWAY_URL": f"http://127.0.0.1:{port}"},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                before = client.batches.retrieve(batch.id).request_counts.completed
                assert before < n, "the batch ended before the kills: make it longer"
                done = finished(client, batch.id, 150)
                assert not pid_alive(victim.pid)
                # The lines the killed worker had in flight went out again, under the new worker's lease.
                resent = BatchLine.objects.filter(batch_id=batch.id, attempts__gt=1).count()
                assert resent > 0
                print(f"{resent} lines sent again after the kills; {before} of {n} were answered before")
                check_output(client, done, n, alone)

                # 3. The web process killed mid-batch and started again: the dispatcher's requests
                # in flight broke; it sends them again once the web answers.
                batch = run_batch(client, 60)
                lines = BatchLine.objects.filter(batch_id=batch.id)
                wait_for(
                    lambda: lines.filter(state="done").count() >= 5 and lines.filter(state="sent").exists(),
                    60,
                    "5 lines answered and more in flight",
                    interval=0.05,
                )
                web = next(p for p in procs if "uvicorn" in p.args)
                os.kill(web.pid, signal.SIGKILL)
                web.wait(10)
                web2, web_log = start_web(tmp_path, port, env, "web-2")
                try:
                    wait_web(f"http://127.0.0.1:{port}")
                    done = finished(client, batch.id, 120)
                    check_output(client, done, 60, alone)
                    # The file the client downloads is the one it was told about, every line in it once.
                    output = client.files.content(done.output_file_id).content
                    assert client.files.retrieve(done.output_file_id).bytes == len(output)

                    # 4. Redis killed mid-batch and started again, empty: the lines in flight broke
                    # (the gateway answered 503) and went out again once every process reconnected.
                    batch = run_batch(client, 60)
                    lines = BatchLine.objects.filter(batch_id=batch.id)
                    wait_for(
                        lambda: lines.filter(state="done").count() >= 5 and lines.filter(state="sent").exists(),
                        60,
                        "5 lines answered and more in flight",
                        interval=0.05,
                    )
                    broker.kill()
                    wait_for(lambda: lines.filter(attempts__gt=1).exists(), 30, "a broken line to be sent again")
                    broker.start()
                    done = finished(client, batch.id, 150)
                    check_output(client, done, 60, alone)
                finally:
                    stop([web2], [web_log], timeout=20)
            finally:
                stop([again], [], timeout=20)
