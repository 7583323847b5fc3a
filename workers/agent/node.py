"""The agent's process-wide state: which node it is, its devices, supervisor and heartbeat."""

from __future__ import annotations

import logging
import os
import socket
import threading

from django.conf import settings

from controlplane.common import redis as redis_client
from controlplane.deployments.models import Replica
from controlplane.deployments.services import transition_replica
from controlplane.inventory import services as inventory
from workers.agent import devices as device_discovery
from workers.agent.supervisor import Supervisor

log = logging.getLogger(__name__)
_agent: NodeAgent | None = None
_lock = threading.Lock()


class NodeAgent:
    def __init__(self, name: str):
        self.name = name
        self.config = settings.SWITCHYARD
        self.devices = device_discovery.discover(self.config["CPU_MEMORY_BYTES"])
        self.supervisor = Supervisor(name, self.config, redis_client.client(), settings.REDIS_URL)
        self._stop = threading.Event()
        self.heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="node-heartbeat", daemon=True)

    def _register(self) -> None:
        inventory.register_node(name=self.name, hostname=socket.gethostname(), devices=self.devices)

    def start(self) -> None:
        self._register()
        # Replicas this node ran before the agent (re)started are not ours any more.
        for r in Replica.objects.filter(node__name=self.name, state__in=Replica.LIVE_STATES):
            transition_replica(
                r.pk,
                Replica.State.FAILED,
                actor_label=f"agent:{self.name}",
                last_error="node agent restarted while the replica was live",
            )
        self.supervisor.thread.start()
        self.heartbeat_thread.start()
        log.info("node agent %s up with %d device(s)", self.name, len(self.devices))

    def _heartbeat_loop(self) -> None:
        from django.db import close_old_connections

        interval = self.config["NODE_HEARTBEAT_SECONDS"]
        while not self._stop.wait(interval):
            try:
                close_old_connections()
                if not inventory.heartbeat(self.name, device_discovery.stats(self.devices)):
                    self._register()  # the node row was deleted: come back
            except Exception:
                log.exception("heartbeat failed")

    def shutdown(self) -> None:
        self._stop.set()
        self.supervisor.shutdown()


def node_name() -> str | None:
    return os.environ.get("SWITCHYARD_NODE")


def get_agent() -> NodeAgent:
    """The running agent, started on first use (normally at worker_ready)."""
    global _agent
    with _lock:
        if _agent is None:
            name = node_name()
            if not name:
                raise RuntimeError("this worker is not a node agent (SWITCHYARD_NODE is unset)")
            _agent = NodeAgent(name)
            _agent.start()
        return _agent


def shutdown_agent() -> None:
    with _lock:
        if _agent is not None:
            _agent.shutdown()
