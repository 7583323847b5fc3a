"""The node agent's outbox keeps what it could not send while the broker was away and sends it,
in order, once it is back; node reports are latest-wins. Its own redis-server on a free port
plays the broker (the machine's Redis is never stopped)."""

from __future__ import annotations

import base64
import json

import pytest
import redis
from celery import Celery

from workers.agent.outbox import Outbox
from workers.bench.processes import RedisServer, free_port
from workers.protocol.control import CONTROL_QUEUE, NodeReport, ReplicaEvent

pytestmark = pytest.mark.timeout(60)


def _queued(client: redis.Redis) -> list[tuple[str, dict]]:
    out = []
    for raw in reversed(client.lrange(CONTROL_QUEUE, 0, -1)):
        message = json.loads(raw)
        out.append((message["headers"]["task"], json.loads(base64.b64decode(message["body"]))[0][0]))
    return out


def test_messages_sent_during_a_broker_outage_arrive_in_order_when_it_returns():
    port = free_port()
    # Not the current app: the control plane's tasks, sent by later tests in this process,
    # would otherwise go to this test's broker, stopped by then.
    app = Celery("outbox-test", broker=f"redis://127.0.0.1:{port}/0", set_as_current=False)
    app.conf.broker_connection_timeout = 1
    outbox = Outbox(app, report_expires=60)
    outbox.thread.start()
    server = None
    try:
        for kind in ("started", "ready", "exited"):
            outbox.replica_event(ReplicaEvent(replica_id=7, kind=kind, node="n1"))
        outbox.node_report(NodeReport(node="n1", hostname="old"))
        outbox.node_report(NodeReport(node="n1", hostname="new"))  # replaces the one not sent
        assert not outbox.flush(timeout=1.5)  # nothing can go: no broker
        assert outbox.pending() == 4

        server = RedisServer(port)
        server.start()
        assert outbox.flush(timeout=20)
        queued = _queued(redis.Redis(port=port))
        assert [(task, body.get("kind") or body.get("hostname")) for task, body in queued] == [
            ("control.replica_event", "started"),
            ("control.replica_event", "ready"),
            ("control.replica_event", "exited"),
            ("control.node_report", "new"),
        ]
    finally:
        outbox.close(timeout=2)
        if server is not None:
            server.kill()
