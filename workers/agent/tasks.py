"""Tasks sent to `node.<name>`; only that node's agent consumes them."""

from celery import shared_task
from celery.signals import worker_ready, worker_shutdown

from workers.agent.node import get_agent, node_name, shutdown_agent


@worker_ready.connect
def _bootstrap(**kwargs):
    if node_name():
        get_agent()


@worker_shutdown.connect
def _shutdown(**kwargs):
    if node_name():
        shutdown_agent()


@shared_task(name="agent.start_replica")
def start_replica(replica_id: int) -> str:
    """Idempotent: a replica already running is left alone."""
    return get_agent().supervisor.start(replica_id)


@shared_task(name="agent.stop_replica")
def stop_replica(replica_id: int) -> str:
    """Idempotent: stopping a stopped replica only confirms its state."""
    return get_agent().supervisor.stop(replica_id)
