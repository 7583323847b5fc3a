"""The agent's process-wide state: which node it is, its devices, supervisor and heartbeat.

The agent talks to the control plane only through Celery and Redis: it reports with messages
(see workers.protocol.control) and reads the replicas' status hashes. It never opens the
database."""

from __future__ import annotations

import logging
import threading
import uuid

import redis

from workers.agent import devices as device_discovery
from workers.agent.config import AgentConfig
from workers.agent.outbox import Outbox
from workers.agent.supervisor import Supervisor
from workers.protocol.control import NodeReport

log = logging.getLogger(__name__)
_agent: NodeAgent | None = None

# A node report older than this is of no use to the control worker: a newer one is coming.
REPORT_EXPIRES_SECONDS = 10.0


class NodeAgent:
    def __init__(self, config: AgentConfig, app):
        self.config = config
        self.name = config.node
        self.agent_id = uuid.uuid4().hex[:12]
        self.devices = device_discovery.discover(config.cpu_memory_bytes, config.cpu_devices)
        self.outbox = Outbox(app, REPORT_EXPIRES_SECONDS)
        client = redis.Redis.from_url(config.redis_url, decode_responses=True, health_check_interval=10)
        self.supervisor = Supervisor(config, client, self.outbox.replica_event)
        self._stop = threading.Event()
        self.heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="node-heartbeat", daemon=True)

    def report(self, leaving: bool = False) -> NodeReport:
        return NodeReport(
            node=self.name,
            hostname=self.config.hostname,
            agent_id=self.agent_id,
            devices=device_discovery.stats(self.devices),
            replicas=self.supervisor.snapshot(),
            leaving=leaving,
        )

    def start(self) -> None:
        adopted = self.supervisor.adopt()
        self.outbox.thread.start()
        self.outbox.node_report(self.report())  # registers the node (and says what it adopted)
        self.supervisor.thread.start()
        self.heartbeat_thread.start()
        log.info(
            "node agent %s up with %d device(s)%s",
            self.name,
            len(self.devices),
            f"; adopted replicas {adopted}" if adopted else "",
        )

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.config.heartbeat_seconds):
            try:
                self.outbox.node_report(self.report())
            except Exception:
                log.exception("heartbeat failed")

    def shutdown(self) -> None:
        """Stopping cleanly: first say so (the control worker places nothing more here), then
        drain and stop the replicas (their replacements go to other nodes)."""
        self._stop.set()
        self.outbox.node_report(self.report(leaving=True))
        self.outbox.flush(timeout=5)
        self.supervisor.shutdown()
        self.outbox.close(timeout=5)


def set_agent(agent: NodeAgent) -> None:
    global _agent
    _agent = agent


def get_agent() -> NodeAgent:
    if _agent is None:
        raise RuntimeError("this process is not a node agent (start one with `python -m workers.agent`)")
    return _agent
