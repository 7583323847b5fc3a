"""Node agent <-> control worker: what travels over Celery between them.

The control worker is the one writer of replica state (it owns the database). A node agent
never touches the database: it receives a self-contained `ReplicaSpec` on its queue
(`node.<name>`) and tells the control worker what happened as messages on the `control` queue:

- `ReplicaEvent` (task `control.replica_event`), sent when it happens: a process started,
  reported ready, exited, was given up on, or stopped.
- `NodeReport` (task `control.node_report`), sent every heartbeat: the node's devices and
  what each supervised replica is doing (pid, load, log tail). It is the agent's heartbeat and
  the control worker's view of what actually runs on the node: a replica the database thinks
  is live there but the agent does not run was lost; one the agent runs but the database has
  stopped is told to stop.

Celery may deliver two messages out of order (the control worker runs tasks on threads), so
each message carries `at_ns`, the agent's wall clock when it was made: a replica's state only
moves on a message newer than the last one applied.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from workers.protocol.replica import ReplicaSpec
from workers.protocol.wire import ProtocolError, Wire, from_wire

VERSION = 1
CONTROL_QUEUE = "control"

# Celery task names (both ends refer to them by name; neither imports the other's tasks).
START_REPLICA = "agent.start_replica"  # args: [ReplicaSpec as a dict]
STOP_REPLICA = "agent.stop_replica"  # args: [replica_id]
REPLICA_EVENT = "control.replica_event"  # args: [ReplicaEvent as a dict]
NODE_REPORT = "control.node_report"  # args: [NodeReport as a dict]


def node_queue(name: str) -> str:
    return f"node.{name}"


@dataclass
class ReplicaEvent(Wire):
    """Something that happened to one replica process, as its agent saw it.

    kind: `started` (a process was spawned: `pid`, `restart_count`), `ready` (the replica
    reported ready), `exited` (it exited and will be restarted: `exit_code`, `signal`, `error`,
    `log_tail`), `failed` (it kept crashing, or could not be started: given up), `stopped`
    (it stopped because it was asked to, or it is not running on this node).

    An unexpected exit (`exited`, or `failed` with an `exit_code`) names the request it is
    attributed to, if any (`request_id`: a suspect in flight, see workers/protocol/suspects.py),
    and whether it counted toward the replica's restart limit (`counted`: not when attributed)."""

    KINDS = ("started", "ready", "exited", "failed", "stopped")

    replica_id: int
    kind: str
    node: str
    at_ns: int = field(default_factory=time.time_ns)
    pid: int | None = None
    exit_code: int | None = None  # negative: killed by that signal (Popen's returncode)
    signal: str = ""  # the signal's name when a signal ended it ("SIGKILL")
    restart_count: int = 0
    error: str = ""
    log_tail: str = ""
    status: dict = field(default_factory=dict)  # the replica's own report: load, endpoint, progress
    request_id: str = ""  # the request an unexpected exit is attributed to ("" if none)
    counted: bool = True  # the exit counted toward the replica's restart limit
    version: int = VERSION

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise ProtocolError(f"unknown replica event kind {self.kind!r}")


@dataclass
class ReplicaReport(Wire):
    """One supervised replica in a node report. `phase`: starting | ready | draining |
    restarting (crashed, waiting out its backoff). `log_tail` is None when unchanged since the
    last report."""

    replica_id: int
    phase: str
    pid: int | None = None
    restart_count: int = 0
    status: dict = field(default_factory=dict)
    log_tail: str | None = None


@dataclass
class NodeReport(Wire):
    """The agent's heartbeat: who it is, its devices, and every replica it supervises."""

    node: str
    hostname: str = ""
    agent_id: str = ""  # changes with every agent start
    at_ns: int = field(default_factory=time.time_ns)
    devices: list[dict] = field(default_factory=list)
    replicas: list[ReplicaReport] = field(default_factory=list)
    leaving: bool = False  # the agent is shutting down: place nothing more on this node
    version: int = VERSION

    def to_wire(self) -> dict:
        return {**super().to_wire(), "replicas": [r.to_wire() for r in self.replicas]}

    @classmethod
    def from_wire(cls, data: dict) -> NodeReport:
        report = from_wire(cls, data)
        report.replicas = [r if isinstance(r, ReplicaReport) else ReplicaReport.from_wire(r) for r in report.replicas]
        return report


def spec_from_wire(data: dict) -> ReplicaSpec:
    if not isinstance(data, dict) or "replica_id" not in data:
        raise ProtocolError("a replica spec needs at least replica_id")
    return ReplicaSpec.from_wire(data)
