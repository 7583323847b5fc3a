"""Replica process supervision on one node.

The supervisor owns the child processes: it starts them, watches them (exit codes, the
replica's own state reports in Redis), restarts a crashed one with exponential backoff up to a
limit, then marks it failed with the last lines of its log; it drains and stops them on request.
Every state change goes through `deployments.services.transition_replica`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.db import close_old_connections
from django.utils import timezone

from controlplane.deployments.models import Replica
from controlplane.deployments.services import transition_replica
from workers.replica.protocol import ReplicaSpec, status_key

log = logging.getLogger(__name__)
State = Replica.State


def build_spec(replica: Replica, settings: dict, redis_url: str) -> ReplicaSpec:
    """What the replica process needs, read from the database once, here, so that the replica
    itself never touches it."""
    deployment = replica.deployment
    policy = deployment.cache_policy
    devices = sorted(replica.devices.all(), key=lambda d: d.index)
    device = "cuda" if devices and devices[0].kind == "cuda" else "cpu"
    return ReplicaSpec(
        replica_id=replica.pk,
        deployment=deployment.slug,
        model=deployment.model.source,
        model_name=deployment.model.name,
        role=replica.role,
        device=device,
        dtype=deployment.dtype,
        block_size=policy.block_size if policy else 16,
        enable_prefix_caching=policy.prefix_caching if policy else True,
        max_num_seqs=deployment.max_num_seqs,
        max_model_len=deployment.max_model_len,
        kv_cache_bytes=settings["REPLICA_CPU_KV_BYTES"],
        threads=settings["REPLICA_CPU_THREADS"],
        kv_protocol=settings["KV_TRANSFER_PROTOCOL"],
        kv_host=settings["KV_TRANSFER_HOST"],
        kv_transfer_timeout=settings["KV_TRANSFER_TIMEOUT"],
        local_prefill_tokens=settings["PD_LOCAL_PREFILL_TOKENS"],
        redis_url=redis_url,
        extra={"cuda_devices": [d.index for d in devices if d.kind == "cuda"]},
    )


def tail(path: Path, lines: int = 40) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(size - 16384, 0))
            return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
    except OSError:
        return ""


@dataclass
class Managed:
    replica_id: int
    log_path: Path
    process: subprocess.Popen | None = None
    restarts: int = 0
    want_running: bool = True
    restart_at: float | None = None
    kill_at: float | None = None
    reported_state: str = ""
    last_db_heartbeat: float = 0.0
    spec_path: Path | None = None
    cuda_devices: list[int] = field(default_factory=list)


class Supervisor:
    def __init__(self, node_name: str, settings: dict, redis_client, redis_url: str):
        self.node = node_name
        self.settings = settings
        self.redis_url = redis_url
        self.command = settings["REPLICA_COMMAND"]
        self.max_restarts = settings["REPLICA_MAX_RESTARTS"]
        self.backoff = settings["REPLICA_BACKOFF_SECONDS"]
        self.stop_timeout = settings["REPLICA_STOP_TIMEOUT"]
        self.log_dir = Path(settings["LOG_DIR"])
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.redis = redis_client
        self.replicas: dict[int, Managed] = {}
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="replica-supervisor", daemon=True)

    # -- commands (from Celery tasks) -----------------------------------------------------------
    def start(self, replica_id: int) -> str:
        with self.lock:
            m = self.replicas.get(replica_id)
            if m and m.process and m.process.poll() is None:
                return "already running"
            replica = Replica.objects.filter(pk=replica_id).select_related("node").first()
            if replica is None or replica.state not in (State.PENDING, State.STARTING):
                return f"not startable ({replica.state if replica else 'gone'})"
            if replica.node is None or replica.node.name != self.node:
                return "assigned to another node"
            m = m or Managed(replica_id, self.log_dir / f"replica-{replica_id}.log")
            m.spec_path = self.log_dir / f"replica-{replica_id}.spec.json"
            spec = build_spec(replica, self.settings, self.redis_url)
            m.spec_path.write_text(spec.to_json())
            m.cuda_devices = spec.extra["cuda_devices"]
            self.replicas[replica_id] = m
            self._spawn(m)
            return "started"

    def stop(self, replica_id: int) -> str:
        with self.lock:
            m = self.replicas.get(replica_id)
            if m is None or m.process is None or m.process.poll() is not None:
                self.replicas.pop(replica_id, None)
                transition_replica(replica_id, State.STOPPED, actor_label=f"agent:{self.node}")
                return "not running"
            m.want_running = False
            m.restart_at = None
            m.kill_at = time.monotonic() + self.stop_timeout
            # SIGTERM asks the replica to drain: finish in-flight requests, accept none.
            m.process.send_signal(signal.SIGTERM)
            return "stopping"

    def shutdown(self) -> None:
        self._stop.set()
        with self.lock:
            for m in self.replicas.values():
                if m.process and m.process.poll() is None:
                    m.process.terminate()
            deadline = time.monotonic() + self.stop_timeout
            for m in self.replicas.values():
                if m.process:
                    try:
                        m.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
                    except subprocess.TimeoutExpired:
                        m.process.kill()
                transition_replica(
                    m.replica_id, State.STOPPED, actor_label=f"agent:{self.node}", last_error="node agent shut down"
                )

    # -- internals ------------------------------------------------------------------------------
    def _spawn(self, m: Managed) -> None:
        args = shlex.split(self.command.format(python=sys.executable, replica_id=m.replica_id))
        env = {
            **os.environ,
            "SWITCHYARD_REPLICA_ID": str(m.replica_id),
            "SWITCHYARD_NODE": self.node,
            "SWITCHYARD_REPLICA_SPEC": str(m.spec_path),
            "PYTHONUNBUFFERED": "1",
        }
        if m.cuda_devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, m.cuda_devices))
        self.redis.delete(status_key(m.replica_id))
        with m.log_path.open("ab") as logf:
            logf.write(f"--- start {timezone.now().isoformat()} (restart {m.restarts}): {' '.join(args)}\n".encode())
            logf.flush()
            try:
                m.process = subprocess.Popen(
                    args, stdout=logf, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL
                )
            except OSError as exc:
                m.process = None
                logf.write(f"cannot start: {exc}\n".encode())
                self.replicas.pop(m.replica_id, None)
                transition_replica(
                    m.replica_id,
                    State.FAILED,
                    actor_label=f"agent:{self.node}",
                    last_error=f"cannot start {args[0]}: {exc}",
                    log_tail=tail(m.log_path),
                )
                return
        m.reported_state = ""
        m.restart_at = None
        transition_replica(
            m.replica_id, State.STARTING, actor_label=f"agent:{self.node}", pid=m.process.pid, restart_count=m.restarts
        )

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            try:
                close_old_connections()
                with self.lock:
                    for m in list(self.replicas.values()):
                        self._check(m)
            except Exception:  # keep supervising whatever one pass hit
                log.exception("supervisor pass failed")

    def _check(self, m: Managed) -> None:
        now = time.monotonic()
        if m.process is None:
            if m.restart_at is not None and now >= m.restart_at:
                self._spawn(m)
            return
        code = m.process.poll()
        if code is None:
            if not m.want_running and m.kill_at is not None and now >= m.kill_at:
                log.warning("replica %s did not stop in time; killing", m.replica_id)
                m.process.kill()
            self._read_status(m, now)
            return
        # The process has exited.
        label = f"agent:{self.node}"
        if not m.want_running:
            self.replicas.pop(m.replica_id, None)
            transition_replica(m.replica_id, State.STOPPED, actor_label=label, log_tail=tail(m.log_path))
            return
        m.process = None
        m.restarts += 1
        error = f"replica process exited with code {code}"
        if m.restarts > self.max_restarts:
            self.replicas.pop(m.replica_id, None)
            transition_replica(
                m.replica_id,
                State.FAILED,
                actor_label=label,
                last_error=f"{error}; gave up after {self.max_restarts} restarts",
                log_tail=tail(m.log_path),
                restart_count=m.restarts - 1,
            )
            return
        delay = self.backoff * 2 ** (m.restarts - 1)
        m.restart_at = now + delay
        log.warning("replica %s: %s; restarting in %.1fs", m.replica_id, error, delay)
        Replica.objects.filter(pk=m.replica_id).update(
            last_error=error, log_tail=tail(m.log_path), restart_count=m.restarts
        )

    def _read_status(self, m: Managed, now: float) -> None:
        raw = self.redis.hgetall(status_key(m.replica_id))
        if not raw:
            return
        state = raw.get("state", "")
        fields = {}
        for key in ("load", "endpoint", "progress"):  # JSON the replica reports; a garbled value is skipped
            if raw.get(key):
                with contextlib.suppress(json.JSONDecodeError):
                    fields[key] = json.loads(raw[key])
        if state == "ready" and m.reported_state != "ready":
            if transition_replica(
                m.replica_id, State.READY, actor_label=f"agent:{self.node}", last_heartbeat=timezone.now(), **fields
            ):
                m.reported_state = "ready"
                m.last_db_heartbeat = now
        elif now - m.last_db_heartbeat >= 2.0:
            m.last_db_heartbeat = now
            # The log tail too, so the console shows what a running replica is saying.
            Replica.objects.filter(pk=m.replica_id).update(
                last_heartbeat=timezone.now(), log_tail=tail(m.log_path, 30), **fields
            )
