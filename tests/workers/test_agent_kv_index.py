"""The node agent drops the KV index (workers/protocol/kv_blocks.py) of a replica process that
is gone, killed or stopped, so that its blocks do not linger for routers. The replicas are
tests/support/fake_replica.py processes under a real Supervisor."""

from __future__ import annotations

import os
import signal
import sys

import pytest
import redis
from django.conf import settings

from tests.support.stack import wait_for
from workers.agent.config import AgentConfig
from workers.agent.supervisor import Supervisor
from workers.protocol.kv_blocks import kv_index_key
from workers.protocol.replica import ReplicaSpec

pytestmark = pytest.mark.timeout(60)
REPLICA = 9421


@pytest.fixture
def supervisor(tmp_path):
    config = AgentConfig(
        node="kv-test", hostname="kv-test", redis_url=settings.REDIS_URL, broker_url=settings.REDIS_URL,
        state_dir=tmp_path, heartbeat_seconds=2, cpu_memory_bytes=1 << 30,
        replica_command=f"{sys.executable} -m tests.support.fake_replica --replica-id {{replica_id}}",
        max_restarts=0, backoff_seconds=0.1, stop_timeout=10, hang_seconds=30, cpu_kv_bytes=1 << 20,
        cpu_threads=0, kv_protocol="tcp", kv_host="127.0.0.1",
    )  # fmt: skip
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    events = []
    sup = Supervisor(config, client, events.append)
    sup.thread.start()
    yield sup, client, events
    sup.shutdown()
    client.delete(kv_index_key(REPLICA))


def ready(sup: Supervisor, client: redis.Redis) -> int:
    sup.start(ReplicaSpec(replica_id=REPLICA, deployment="kv-test", model_dir="/nowhere", model_name="m"))
    wait_for(lambda: sup.replicas[REPLICA].ready, 20, "the replica to be ready")
    client.sadd(kv_index_key(REPLICA), "1", "2")  # what the replica published
    return sup.replicas[REPLICA].process.pid


def test_a_killed_replica_s_set_is_dropped(supervisor):
    sup, client, events = supervisor
    os.kill(ready(sup, client), signal.SIGKILL)
    wait_for(lambda: any(e.kind == "failed" for e in events), 20, "the agent to see the replica gone")
    assert not client.exists(kv_index_key(REPLICA))


def test_a_stopped_replica_s_set_is_dropped(supervisor):
    sup, client, events = supervisor
    ready(sup, client)
    assert sup.stop(REPLICA) == "stopping"
    wait_for(lambda: any(e.kind == "stopped" for e in events), 20, "the replica to stop")
    assert not client.exists(kv_index_key(REPLICA))
