"""A real node agent (Celery worker process) and a real control worker supervise replica
processes end to end: ready, killed → restarted, stopped → gone."""

import os
import signal
import uuid

import pytest
from django.conf import settings

from controlplane.deployments.models import Replica
from controlplane.inventory.models import Node
from tests.support.stack import pid_alive, processes, stack_env, wait_for


@pytest.fixture
def cluster(transactional_db, tmp_path):
    node = f"itest-{uuid.uuid4().hex[:6]}"
    env = stack_env(
        tmp_path,
        REPLICA_COMMAND="{python} -m tests.support.fake_replica --replica-id {replica_id}",
        REPLICA_MAX_RESTARTS="2",
    )
    with processes(tmp_path, node, env):
        wait_for(lambda: Node.objects.filter(name=node, status="online").exists(), 60, "the agent to register")
        yield node, tmp_path


def test_agent_supervises_replicas_end_to_end(cluster, staff_client, model_dir):
    node_name, state_dir = cluster
    node = Node.objects.get(name=node_name)
    assert node.queue == f"node.{node_name}"
    assert [(d.kind, d.index) for d in node.devices.all()] == [("cpu", 0)]

    assert (
        staff_client.post("/api/v1/models/", {"name": "tiny", "source": str(model_dir)}, format="json").status_code
        == 201
    )
    created = staff_client.post("/api/v1/deployments/", {"slug": "itest", "model": "tiny"}, format="json")
    assert created.status_code == 201

    def ready_replica():
        return Replica.objects.filter(deployment__slug="itest", state="ready").first()

    replica = wait_for(ready_replica, 60, "the replica to become ready")
    assert replica.node.name == node_name and replica.pid
    first_pid = replica.pid
    assert pid_alive(first_pid)

    # Kill the process: the supervisor restarts it (backoff 0.2 s) and it becomes ready again.
    os.kill(first_pid, signal.SIGKILL)

    def restarted():
        r = Replica.objects.get(pk=replica.pk)
        return r if r.state == "ready" and r.pid and r.pid != first_pid and r.restart_count == 1 else None

    again = wait_for(restarted, 60, "the replica to be restarted")
    assert "exited with code -9" in again.last_error

    # Stop the deployment: the replica drains and its process is gone.
    assert staff_client.post("/api/v1/deployments/itest/stop/").status_code == 200
    stopped = wait_for(
        lambda: Replica.objects.filter(pk=replica.pk, state="stopped").first(), 60, "the replica to stop"
    )
    assert stopped.pid is None
    assert not pid_alive(again.pid)
    assert "drained and stopped" in stopped.log_tail
    log_file = state_dir / "logs" / f"replica-{replica.pk}.log"
    assert log_file.read_text().count("--- start") == 2


def test_replica_that_keeps_crashing_is_marked_failed_with_its_log(cluster, model_dir):
    import redis

    from controlplane.catalog.services import register_model
    from controlplane.deployments.services import create_deployment
    from tests.support.fake_replica import CRASH_FLAG

    redis.Redis.from_url(settings.REDIS_URL).set(CRASH_FLAG, "1")
    try:
        model = register_model(name="tiny2", source=str(model_dir))
        create_deployment({"slug": "crashy", "model": model, "replicas": 1})
        failed = wait_for(
            lambda: Replica.objects.filter(deployment__slug="crashy", state="failed").first(),
            60,
            "the replica to be given up on",
        )
    finally:
        redis.Redis.from_url(settings.REDIS_URL).delete(CRASH_FLAG)
    assert failed.node.name == cluster[0]
    assert "exited with code 3" in failed.last_error and "gave up after 2 restarts" in failed.last_error
    assert "cannot load model" in failed.log_tail
    assert failed.restart_count == 2
