"""Tasks sent to `node.<name>`; only that node's agent consumes them. Both are idempotent."""

from __future__ import annotations

from celery import Celery

from workers.agent.node import get_agent
from workers.protocol.control import START_REPLICA, STOP_REPLICA, spec_from_wire


def register(app: Celery) -> None:
    @app.task(name=START_REPLICA)
    def start_replica(spec: dict) -> str:
        """A replica already running is left alone (and its state reported again)."""
        return get_agent().supervisor.start(spec_from_wire(spec))

    @app.task(name=STOP_REPLICA)
    def stop_replica(replica_id: int) -> str:
        """Stopping a replica that does not run here only confirms it is stopped."""
        return get_agent().supervisor.stop(int(replica_id))
