"""Replica deaths as the node agent sees them and the control worker records them: every
unexpected exit is a `replica.crashed` event with its exit code (or signal) and the last lines of
its log, counted for /metrics; and a death with a suspect request in flight (one the gateway sent on
after a replica died under it: failover.Losses) is that request's doing, so the two deaths of one
poison request cost the deployment's failure budget once and it stays running.

The agent is a real Supervisor whose replicas are tests/support/fake_replica.py processes, killed
for real; its reports are applied by node_sync as the control worker applies them. A fake replica
reports no incarnation, so each test writes one into its status hash as a real replica does."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest
import redis
import redis.asyncio as aioredis
from django.conf import settings

from controlplane.catalog.services import register_model
from controlplane.deployments import crashes
from controlplane.deployments.models import Deployment, Replica
from controlplane.deployments.node_sync import apply_replica_event
from controlplane.deployments.reconciler import reconcile_all
from controlplane.deployments.services import create_deployment
from controlplane.events.models import Event
from controlplane.gateway import failover
from controlplane.telemetry.prometheus import render
from tests.support.stack import wait_for
from workers.agent.config import AgentConfig
from workers.agent.supervisor import Supervisor
from workers.protocol.replica import ReplicaSpec, status_key

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(90)]


@pytest.fixture
def client():
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    client.delete(crashes.COUNTS_KEY)
    yield client
    client.delete(crashes.COUNTS_KEY)
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete("node.node-a", "control")  # the start and reconcile messages nobody consumes here
    client.close()


def supervisor(tmp_path, client, crash_after: float | None = None) -> tuple[Supervisor, list]:
    """An agent for node-a that gives up on a replica at its first counted exit and waits long
    before a restart (the test looks at the replica in between)."""
    command = f"{sys.executable} -m tests.support.fake_replica --replica-id {{replica_id}}"
    if crash_after is not None:
        command += f" --crash-after {crash_after}"
    config = AgentConfig(
        node="node-a", hostname="host-a", redis_url=settings.REDIS_URL, broker_url=settings.REDIS_URL,
        state_dir=tmp_path, heartbeat_seconds=2, cpu_memory_bytes=1 << 30, replica_command=command,
        max_restarts=0, backoff_seconds=30, stop_timeout=10, hang_seconds=30, cpu_kv_bytes=1 << 20,
        cpu_threads=0, kv_protocol="tcp", kv_host="127.0.0.1",
    )  # fmt: skip
    events: list = []
    sup = Supervisor(config, client, events.append)
    sup.thread.start()
    return sup, events


def deploy(node, replicas: int, capture) -> list[Replica]:
    model = register_model(name="tiny", source="org/tiny", source_type="hub")
    create_deployment({"slug": "pair", "model": model, "replicas": replicas})
    with capture(execute=True):
        reconcile_all()
    return list(Replica.objects.order_by("pk"))


def run(sup: Supervisor, client, r: Replica) -> str:
    """Start `r`'s process, wait until it reports ready; its incarnation."""
    sup.start(ReplicaSpec(replica_id=r.pk, deployment="pair", model_dir="/nowhere", model_name="m"))
    wait_for(lambda: sup.replicas[r.pk].ready, 20, f"replica {r.pk} to be ready")
    incarnation = f"incarnation-{r.pk}"
    client.hset(status_key(r.pk), "incarnation", incarnation)
    return incarnation


def kill(sup: Supervisor, events: list, r: Replica, kind: str):
    os.kill(sup.replicas[r.pk].process.pid, signal.SIGKILL)
    return wait_for(
        lambda: next((e for e in events if e.replica_id == r.pk and e.kind == kind), None),
        20,
        f"the agent to report replica {r.pk} {kind}",
    )


def apply(events: list, capture) -> None:
    with capture(execute=True):
        for event in events:
            apply_replica_event(event)


def crashed(r: Replica) -> list[dict]:
    return [e.data for e in Event.objects.filter(verb="replica.crashed", object_id=str(r.pk)).order_by("id")]


def test_two_deaths_of_one_poison_request_cost_the_budget_once(
    node, tmp_path, client, settings, django_capture_on_commit_callbacks
):
    settings.SWITCHYARD = {**settings.SWITCHYARD, "REPLICA_FAILURE_BUDGET": 2}
    first, second = deploy(node, 2, django_capture_on_commit_callbacks)
    sup, events = supervisor(tmp_path, client)
    try:
        lost_incarnation = run(sup, client, first)
        incarnation = run(sup, client, second)

        # The request was in flight on `first` when it died (nobody could suspect it yet: that
        # death counts), and the gateway sends it on to `second` as a suspect.
        async def send_on():
            gateway = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
            losses = failover.Losses(request_id="chatcmpl-poison")
            losses.add(first.pk, lost_incarnation)
            await losses.mark_suspect(gateway, second.pk, incarnation, "chatcmpl-poison-r1.0")
            await gateway.aclose()
            return losses.mark

        gave_up = kill(sup, events, first, "failed")
        assert asyncio.run(send_on()) is not None
        exited = kill(sup, events, second, "exited")  # and it killed `second` too
        assert not client.exists(status_key(second.pk))  # gateways see it gone at once
    finally:
        sup.shutdown()
    assert (gave_up.counted, gave_up.request_id, gave_up.signal) == (True, "", "SIGKILL")
    assert (exited.counted, exited.request_id, exited.exit_code) == (False, "chatcmpl-poison", -9)
    assert "chatcmpl-poison" in exited.error and exited.restart_count == 1

    apply([e for e in events if e.kind != "stopped"], django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        reconcile_all()
    deployment = Deployment.objects.get()
    assert deployment.status == "running" and deployment.failed_at is None
    states = dict(Replica.objects.values_list("pk", "state"))
    assert states[first.pk] == "failed" and states[second.pk] == "starting"  # restarting: not failed
    assert sorted(states.values()).count("pending") == 1  # `first` is replaced: budget is left

    [first_crash] = crashed(first)
    assert first_crash["counted"] is True and first_crash["request_id"] is None and first_crash["gave_up"]
    assert (first_crash["exit_code"], first_crash["signal"]) == (-9, "SIGKILL")
    assert f"fake replica {first.pk} pid" in first_crash["log_tail"]
    [second_crash] = crashed(second)
    assert second_crash["counted"] is False and second_crash["request_id"] == "chatcmpl-poison"
    assert not second_crash["gave_up"] and second_crash["deployment"] == "pair"
    metrics = render(client)
    assert 'switchyard_replica_crashes_total{deployment="pair",attributed="false"} 1' in metrics
    assert 'switchyard_replica_crashes_total{deployment="pair",attributed="true"} 1' in metrics


def test_a_crash_is_an_event_with_its_exit_code_and_log_tail(
    node, tmp_path, client, django_capture_on_commit_callbacks
):
    [r] = deploy(node, 1, django_capture_on_commit_callbacks)
    sup, events = supervisor(tmp_path, client, crash_after=0.5)
    try:
        sup.start(ReplicaSpec(replica_id=r.pk, deployment="pair", model_dir="/nowhere", model_name="m"))
        failed = wait_for(lambda: next((e for e in events if e.kind == "failed"), None), 20, "the replica to exit")
    finally:
        sup.shutdown()
    apply([e for e in events if e.kind != "stopped"], django_capture_on_commit_callbacks)
    [crash] = crashed(r)
    assert crash["exit_code"] == 3 and crash["signal"] is None and crash["counted"] is True
    assert crash["error"] == failed.error and "exited with code 3" in crash["error"]
    assert crash["log_tail"].splitlines()[-1] == "fake replica crashing on purpose"
    assert len(crash["log_tail"].splitlines()) <= crashes.TAIL_LINES
    assert Event.objects.filter(verb="replica.failed", object_id=str(r.pk)).exists()
