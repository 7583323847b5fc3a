"""A real node agent (Celery worker process) and a real control worker supervise replica
processes end to end: ready, killed → restarted, hung → killed and restarted, stopped → gone;
an agent killed and started again adopts its replicas, or has the lost ones replaced. Every
process has SWITCHYARD_NODE set and the agent has no usable database URL (tests/support/stack)."""

import os
import signal
import uuid

import pytest
from django.conf import settings

from controlplane.deployments.models import Replica
from controlplane.inventory.models import Node
from tests.support.stack import pid_alive, processes, stack_env, start_agent, stop, wait_for, wait_online, wait_ready


@pytest.fixture
def cluster(transactional_db, tmp_path):
    node = f"itest-{uuid.uuid4().hex[:6]}"
    env = stack_env(
        tmp_path,
        REPLICA_COMMAND="{python} -m tests.support.fake_replica --replica-id {replica_id}",
        REPLICA_MAX_RESTARTS="2",
        REPLICA_HANG_SECONDS="3",
    )
    with processes(tmp_path, node, env) as procs:
        wait_online(node)
        yield node, tmp_path, env, procs


def _deploy(model_dir, slug: str) -> Replica:
    from controlplane.catalog.services import register_model
    from controlplane.deployments.services import create_deployment

    model = register_model(name=f"m-{slug}", source=str(model_dir))
    create_deployment({"slug": slug, "model": model, "replicas": 1})
    [replica] = wait_ready(slug, 1, 60)
    return replica


def _kill_agent(procs) -> None:
    agent = procs[1]
    agent.kill()
    agent.wait(timeout=10)


def test_agent_supervises_replicas_end_to_end(cluster, staff_client, model_dir):
    node_name, state_dir, _, _ = cluster
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


def test_hung_replica_is_killed_and_restarted(cluster, model_dir):
    replica = _deploy(model_dir, "hung")
    os.kill(replica.pid, signal.SIGSTOP)  # alive, but its heartbeat stops

    def restarted():
        r = Replica.objects.get(pk=replica.pk)
        return r if r.state == "ready" and r.pid != replica.pid and r.restart_count == 1 else None

    again = wait_for(restarted, 60, "the hung replica to be killed and restarted")
    assert "exited with code -9" in again.last_error
    assert not pid_alive(replica.pid)
    log_file = cluster[1] / "logs" / f"replica-{replica.pk}.log"
    assert "no heartbeat for 3s: killed by the node agent" in log_file.read_text()


def test_restarted_agent_adopts_the_replicas_it_left_running(cluster, model_dir):
    node_name, state_dir, env, procs = cluster
    replica = _deploy(model_dir, "adopt")
    _kill_agent(procs)
    assert pid_alive(replica.pid)  # the replica outlives its agent

    agent, agent_log = start_agent(state_dir, node_name, env, log_name="agent-2")
    try:
        wait_for(lambda: f"adopted replicas [{replica.pk}]" in (state_dir / "agent-2.log").read_text(), 60, "adoption")
        # A few node reports later, the replica is still the same process, ready, never failed.
        first = Node.objects.get(name=node_name).last_heartbeat
        wait_for(lambda: Node.objects.get(name=node_name).last_heartbeat > first, 30, "a report from the new agent")
        r = Replica.objects.get(pk=replica.pk)
        assert (r.state, r.pid, r.restart_count) == ("ready", replica.pid, 0)
        assert not Replica.objects.filter(deployment__slug="adopt").exclude(pk=replica.pk).exists()

        # The new agent supervises it: a stop drains the adopted process.
        from controlplane.deployments.models import Deployment
        from controlplane.deployments.services import stop as stop_deployment

        stop_deployment(Deployment.objects.get(slug="adopt"))
        wait_for(lambda: Replica.objects.filter(pk=replica.pk, state="stopped").exists(), 60, "the replica to stop")
        wait_for(lambda: not pid_alive(replica.pid), 30, "the adopted process to exit")
    finally:
        stop([agent], [agent_log])


def test_replica_lost_with_its_agent_is_replaced_without_counting_as_a_failure(cluster, model_dir):
    node_name, state_dir, env, procs = cluster
    replica = _deploy(model_dir, "lost")
    _kill_agent(procs)
    os.kill(replica.pid, signal.SIGKILL)  # gone while no agent watched it

    agent, agent_log = start_agent(state_dir, node_name, env, log_name="agent-2")
    try:
        lost = wait_for(
            lambda: Replica.objects.filter(pk=replica.pk, state="stopped").first(), 60, "the lost replica to be stopped"
        )
        assert "the node agent does not run it" in lost.last_error
        wait_for(
            lambda: Replica.objects.filter(deployment__slug="lost", state="ready").exclude(pk=replica.pk).first(),
            60,
            "a replacement replica to be ready",
        )
        assert not Replica.objects.filter(deployment__slug="lost", state="failed").exists()
    finally:
        stop([agent], [agent_log])
