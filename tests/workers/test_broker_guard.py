"""Celery workers outlive a Redis restart with a task in flight (workers/protocol/broker.py).

The crash needs a task delivered and not yet acknowledged at the instant Redis dies, and
Celery's consumer closing its connection after kombu's transport dropped its client: a race we
cannot cause on demand (test_faults.py met it about once in ten runs). So this test builds that
state for real on its own redis-server, a message delivered and unacknowledged, the server
killed, except for one line that sets what the race leaves: the transport's client gone."""

import subprocess
import sys
from pathlib import Path

import pytest
import redis
from kombu import Connection

from workers.bench.processes import RedisServer
from workers.protocol import broker


@pytest.fixture
def delivered():
    server = RedisServer()
    server.start()
    conn = Connection(server.url)
    queue = conn.SimpleQueue("switchyard-test-unacked")
    queue.put({"task": 1})
    message = queue.get(timeout=5)  # delivered, not acknowledged
    yield server, conn, message
    server.kill()


def test_closing_a_channel_after_the_transport_let_go_does_not_crash(delivered):
    server, conn, message = delivered
    channel = message.channel
    assert len(channel.qos._delivered) == 1
    unacked = redis.Redis.from_url(server.url).hlen(channel.unacked_key)
    assert unacked == 1  # the broker keeps it for the visibility timeout
    server.kill()
    conn.transport.client = None  # the state the race leaves (see the module docstring)
    channel._pool = None
    with pytest.raises(AttributeError, match="hostname"):  # kombu's own restore crashes here
        broker._original_restore_unacked(channel.qos)
    broker.survive_broker_loss_with_tasks_in_flight()
    broker.survive_broker_loss_with_tasks_in_flight()  # idempotent
    assert channel.qos.restore_unacked() == []
    channel.qos.restore_unacked_once()  # what Celery's close calls: no exception now


def test_a_task_finishing_after_its_channel_closed_is_not_a_crash(delivered):
    """The task that ran while Redis died ends after Celery closed its channel: its late
    acknowledgement went to a channel with no connection and raised, and the worker exited."""
    server, conn, message = delivered
    server.kill()
    conn.transport.client = None  # as above: the state the race leaves
    message.channel._pool = None
    broker.survive_broker_loss_with_tasks_in_flight()
    message.channel.close()  # as Celery's consumer does on the lost connection
    assert message.channel.connection is None
    with pytest.raises(AttributeError, match="client"):  # kombu's own acknowledgement crashes here
        broker._original_ack(message.channel.qos, message.delivery_tag)
    message.ack()  # the guard: no exception
    assert message.acknowledged


def test_the_control_worker_and_the_agent_install_the_guard():
    """In a fresh interpreter, as a control worker starts: its Celery app installs the guard.
    The agent builds its app inside main(), which starts a worker; its call is checked in place."""
    check = (
        "import controlplane.config.celery_app; from kombu.transport import redis; "
        "from workers.protocol import broker; assert redis.QoS.restore_unacked is broker._restore_unacked; "
        "assert redis.QoS.ack is broker._ack and redis.QoS.reject is broker._reject"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    agent = Path("workers/agent/__main__.py").read_text()
    assert agent.index("survive_broker_loss_with_tasks_in_flight()") < agent.index("app.worker_main(")
