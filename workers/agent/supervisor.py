"""Replica process supervision on one node.

The supervisor owns the child processes: it starts them from the spec the control worker sent,
watches them (exit codes, the replica's own reports in Redis), restarts a crashed or hung one
with exponential backoff up to a limit, then gives up with the last lines of its log; it drains
and stops them on request. Every unexpected exit is reported with its exit code (or signal) and
log tail; one with a suspect request in flight (workers/protocol/suspects.py: it was in flight on
a replica that died before) is that request's doing and does not count toward the limit. It
never writes the database: every change is a `ReplicaEvent` handed to `report`, which the agent
sends to the control worker.

An agent that is killed leaves its replicas running (they are in their own session). Next to
each replica's log it keeps the spec and the pid, so that the next agent on this node adopts
the replicas that still run instead of starting them again or leaving them orphaned.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import psutil
import redis

from workers.agent.config import AgentConfig
from workers.protocol.control import ReplicaEvent, ReplicaReport
from workers.protocol.kv_blocks import kv_index_key
from workers.protocol.replica import HEARTBEAT_STALE_SECONDS, ReplicaSpec, ReplicaStatus, status_key
from workers.protocol.suspects import Suspect, suspects_key
from workers.protocol.wire import ProtocolError

log = logging.getLogger(__name__)
UNKNOWN_EXIT = -1000  # an adopted process is not our child: its exit code cannot be read


def describe_exit(code: int) -> tuple[str, str]:
    """What ended a replica process, in words, and the signal's name if a signal did."""
    if code == UNKNOWN_EXIT:
        return "replica process exited (adopted after an agent restart: exit code unknown)", ""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"replica process exited with code {code} ({name})", name
    return f"replica process exited with code {code}", ""


def tail(path: Path, lines: int = 40) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(size - 16384, 0))
            return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
    except OSError:
        return ""


class AdoptedProcess:
    """A replica process started by an earlier agent on this node, with Popen's few methods
    the supervisor uses."""

    def __init__(self, pid: int):
        self.pid = pid
        self._proc = psutil.Process(pid)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                gone = self._proc.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                gone = True
            if gone:
                self.returncode = UNKNOWN_EXIT
        return self.returncode

    def send_signal(self, sig: int) -> None:
        with contextlib.suppress(psutil.NoSuchProcess):
            self._proc.send_signal(sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        try:
            self._proc.wait(timeout)
        except psutil.TimeoutExpired:
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0) from None
        except psutil.NoSuchProcess:
            pass
        self.returncode = UNKNOWN_EXIT
        return self.returncode


def _is_replica_process(pid: int, replica_id: int) -> bool:
    """True when `pid` is alive and is replica `replica_id` (a reused pid is not adopted)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return proc.environ().get("SWITCHYARD_REPLICA_ID") == str(replica_id)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


@dataclass
class Managed:
    spec: ReplicaSpec
    log_path: Path
    spec_path: Path
    pid_path: Path
    process: subprocess.Popen | AdoptedProcess | None = None
    restarts: int = 0
    forgiven: int = 0  # restarts after exits attributed to a request: not counted toward the limit
    want_running: bool = True
    restart_at: float | None = None
    kill_at: float | None = None
    ready: bool = False
    status: dict = field(default_factory=dict)  # the replica's last own report (load, endpoint, progress)
    heartbeat: float | None = None  # its last heartbeat (unix time), once ready
    sent_tail: str | None = None

    @property
    def replica_id(self) -> int:
        return self.spec.replica_id

    @property
    def counted_restarts(self) -> int:
        return self.restarts - self.forgiven

    @property
    def phase(self) -> str:
        if self.process is None:
            return "restarting"
        if not self.want_running:
            return "draining"
        return "ready" if self.ready else "starting"


class Supervisor:
    def __init__(self, config: AgentConfig, redis_client, report: Callable[[ReplicaEvent], None]):
        self.config = config
        self.node = config.node
        self.log_dir = config.log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.redis = redis_client
        self.report = report
        self.replicas: dict[int, Managed] = {}
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._redis_down = False
        self.thread = threading.Thread(target=self._loop, name="replica-supervisor", daemon=True)

    def _event(self, m: Managed, kind: str, **fields) -> None:
        self.report(
            ReplicaEvent(replica_id=m.replica_id, kind=kind, node=self.node, restart_count=m.restarts, **fields)
        )

    def _managed(self, spec: ReplicaSpec) -> Managed:
        base = self.log_dir / f"replica-{spec.replica_id}"
        return Managed(
            spec=spec,
            log_path=base.with_suffix(".log"),
            spec_path=base.with_suffix(".spec.json"),
            pid_path=base.with_suffix(".pid"),
        )

    def node_spec(self, spec: ReplicaSpec) -> ReplicaSpec:
        """The control worker describes the deployment; this node fills in what is its own."""
        tiers = spec.kv_tiers
        if tiers is not None and tiers.store_master:  # other store clients reach this replica as they reach the node
            tiers = replace(
                tiers,
                local_hostname=self.config.kv_host,
                store_protocol=self.config.kv_protocol,
                store_device=self.config.kv_store_device,
                store_segment_bytes=self.config.kv_store_segment_bytes,
            )
        return replace(
            spec,
            redis_url=self.config.redis_url,
            kv_host=self.config.kv_host,
            kv_protocol=self.config.kv_protocol,
            threads=self.config.cpu_threads if spec.device == "cpu" else 0,
            kv_cache_bytes=self.config.cpu_kv_bytes if spec.device == "cpu" else spec.kv_cache_bytes,
            kv_tiers=tiers,
        )

    # -- commands (from Celery tasks) -----------------------------------------------------------
    def start(self, spec: ReplicaSpec) -> str:
        with self.lock:
            m = self.replicas.get(spec.replica_id)
            if m is not None and m.want_running:
                if m.process is not None and m.process.poll() is None:
                    self._event(m, "ready" if m.ready else "started", pid=m.process.pid, status=m.status)
                return "already running"
            m = self._managed(self.node_spec(spec))
            m.spec_path.write_text(m.spec.to_json())
            self.replicas[spec.replica_id] = m
            self._spawn(m)
            return "started"

    def stop(self, replica_id: int) -> str:
        with self.lock:
            m = self.replicas.get(replica_id)
            if m is None or m.process is None or m.process.poll() is not None:
                if m is not None:
                    self._forget(m)
                self.report(ReplicaEvent(replica_id=replica_id, kind="stopped", node=self.node))
                return "not running"
            if m.want_running:
                m.want_running = False
                m.restart_at = None
                m.kill_at = time.monotonic() + self.config.stop_timeout
                # SIGTERM asks the replica to drain: finish in-flight requests, accept none.
                m.process.send_signal(signal.SIGTERM)
            return "stopping"

    def adopt(self) -> list[int]:
        """Take over the replicas an earlier agent on this node left running; clear what is
        left of the ones that are gone (the control worker learns from the node report that
        this agent does not run them)."""
        adopted = []
        with self.lock:
            for spec_path in sorted(self.log_dir.glob("replica-*.spec.json")):
                try:
                    spec = ReplicaSpec.from_json(spec_path.read_text())
                    m = self._managed(spec)
                    pid, restarts, *forgiven = (int(x) for x in m.pid_path.read_text().split())
                except (OSError, ValueError, TypeError):
                    spec_path.unlink(missing_ok=True)
                    continue
                if spec.replica_id in self.replicas or not _is_replica_process(pid, spec.replica_id):
                    if spec.replica_id not in self.replicas:
                        self._drop_kv_index(spec.replica_id)  # it died while no agent watched
                    self._forget(m)
                    continue
                m.process = AdoptedProcess(pid)
                m.restarts, m.forgiven = restarts, forgiven[0] if forgiven else 0
                self.replicas[spec.replica_id] = m
                adopted.append(spec.replica_id)
                log.info("adopted replica %s (pid %s), left running by an earlier agent", spec.replica_id, pid)
        return adopted

    def shutdown(self) -> None:
        """The agent is stopping cleanly: drain and stop every replica it runs."""
        self._stop.set()
        with self.lock:
            running = [m for m in self.replicas.values() if m.process and m.process.poll() is None]
            for m in running:
                m.process.terminate()
            deadline = time.monotonic() + self.config.stop_timeout
            for m in running:
                try:
                    m.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    m.process.kill()
            for m in list(self.replicas.values()):
                self._drop_kv_index(m.replica_id)
                self._event(m, "stopped", error="node agent shut down", log_tail=tail(m.log_path))
                self._forget(m)

    def snapshot(self) -> list[ReplicaReport]:
        """What each supervised replica is doing, for the node report. A log tail goes along
        only when it changed since the last report."""
        out = []
        with self.lock:
            for m in self.replicas.values():
                text = tail(m.log_path, 30)
                changed = text != m.sent_tail
                m.sent_tail = text
                out.append(
                    ReplicaReport(
                        replica_id=m.replica_id,
                        phase=m.phase,
                        pid=m.process.pid if m.process else None,
                        restart_count=m.restarts,
                        status=dict(m.status),
                        log_tail=text if changed else None,
                    )
                )
        return out

    # -- internals ------------------------------------------------------------------------------
    def _drop_kv_index(self, replica_id: int) -> None:
        """A replica process that is gone holds no KV: drop the block hashes it published for
        routing (workers.protocol.kv_blocks). Routers read only ready replicas' sets, so this
        is hygiene: with Redis away it is skipped, and a next incarnation drops them anyway."""
        try:
            self.redis.delete(kv_index_key(replica_id))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("replica %s: could not drop its KV index (%s)", replica_id, exc)

    def _forget(self, m: Managed) -> None:
        self.replicas.pop(m.replica_id, None)
        m.spec_path.unlink(missing_ok=True)
        m.pid_path.unlink(missing_ok=True)

    def _spawn(self, m: Managed) -> None:
        args = shlex.split(self.config.replica_command.format(python=sys.executable, replica_id=m.replica_id))
        env = {
            **os.environ,
            "SWITCHYARD_REPLICA_ID": str(m.replica_id),
            "SWITCHYARD_NODE": self.node,
            "SWITCHYARD_REPLICA_SPEC": str(m.spec_path),
            "REDIS_URL": self.config.redis_url,
            "PYTHONUNBUFFERED": "1",
        }
        if m.spec.cuda_devices:  # numbered as nvidia-smi numbers them (devices.py)
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, m.spec.cuda_devices))
        self.redis.delete(status_key(m.replica_id))
        with m.log_path.open("ab") as logf:
            stamp = datetime.now(UTC).isoformat()
            logf.write(f"--- start {stamp} (restart {m.restarts}): {' '.join(args)}\n".encode())
            logf.flush()
            try:
                # Its own session: a terminal's Ctrl-C or the agent's death does not reach it.
                m.process = subprocess.Popen(
                    args,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as exc:
                m.process = None
                logf.write(f"cannot start: {exc}\n".encode())
                self._forget(m)
                self._event(m, "failed", error=f"cannot start {args[0]}: {exc}", log_tail=tail(m.log_path))
                return
        m.pid_path.write_text(f"{m.process.pid} {m.restarts} {m.forgiven}")
        m.ready, m.status, m.heartbeat = False, {}, None
        m.restart_at = None
        self._event(m, "started", pid=m.process.pid)

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            try:
                with self.lock:
                    for m in list(self.replicas.values()):
                        self._check_one(m)
            except Exception:
                log.exception("supervisor pass failed")

    def _check_one(self, m: Managed) -> None:
        try:
            self._check(m)
        except (redis.ConnectionError, redis.TimeoutError) as exc:  # waited out: its status is read again later
            if not self._redis_down:
                log.warning("Redis unreachable (%s); replicas are still watched, their reports wait", exc)
            self._redis_down = True
            return
        except Exception:  # keep supervising the others, try again next pass
            log.exception("supervising replica %s failed", m.replica_id)
            return
        if self._redis_down:
            log.info("Redis is back")
            self._redis_down = False

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
            # Judged only on a fresh read: while Redis is unreachable no heartbeat is stale.
            if self._read_status(m) and m.want_running and self._hung(m):
                hang = self.config.hang_seconds
                log.warning("replica %s stopped heartbeating for %.0fs; killing it", m.replica_id, hang)
                with m.log_path.open("ab") as logf:
                    logf.write(f"--- no heartbeat for {hang:.0f}s: killed by the node agent\n".encode())
                m.process.kill()
            return
        # The process has exited.
        self._drop_kv_index(m.replica_id)
        if not m.want_running:
            self._forget(m)
            self._event(m, "stopped", log_tail=tail(m.log_path))
            return
        blamed = self._blamed(m)  # before its status hash goes: it names the incarnation that died
        self._drop_status(m.replica_id)
        m.process = None
        m.ready = False
        m.restarts += 1
        if blamed:
            m.forgiven += 1
        error, signame = describe_exit(code)
        if blamed:
            error += f", with request {blamed} in flight, which a replica had died under before (not counted)"
        crash = {
            "exit_code": None if code == UNKNOWN_EXIT else code,
            "signal": signame,
            "request_id": blamed,
            "counted": not blamed,
            "log_tail": tail(m.log_path),
        }
        if m.counted_restarts > self.config.max_restarts:
            m.restarts -= 1
            self._forget(m)
            self._event(m, "failed", error=f"{error}; gave up after {self.config.max_restarts} restarts", **crash)
            return
        delay = self.config.backoff_seconds * 2 ** max(m.counted_restarts - 1, 0)
        m.restart_at = now + delay
        log.warning("replica %s: %s; restarting in %.1fs", m.replica_id, error, delay)
        self._event(m, "exited", error=error, **crash)

    def _blamed(self, m: Managed) -> str:
        """The request the exit of `m`'s process is attributed to: a suspect in flight on the
        incarnation that died (workers/protocol/suspects.py), or "". Redis unreachable: none (the
        exit counts, as every exit did before suspects)."""
        try:
            incarnation = self.redis.hget(status_key(m.replica_id), "incarnation")
            raw = self.redis.hgetall(suspects_key(m.replica_id, incarnation)) if incarnation else {}
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("replica %s: cannot read its suspects (%s); the exit counts", m.replica_id, exc)
            return ""
        for field_id, value in sorted(raw.items()):
            try:
                return Suspect.decode(value).request_id or field_id
            except ProtocolError as exc:
                log.warning("replica %s: unreadable suspect %s (%s)", m.replica_id, field_id, exc)
        return ""

    def _drop_status(self, replica_id: int) -> None:
        """The process is gone: without its status hash no router sends it requests and every
        gateway waiting on it sees it lost at its next check, rather than when the heartbeat goes
        stale (HEARTBEAT_STALE_SECONDS) or the restart drops it."""
        try:
            self.redis.delete(status_key(replica_id))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("replica %s: could not drop its status (%s)", replica_id, exc)

    def _hung(self, m: Managed) -> bool:
        """A ready replica whose heartbeat stopped (a hung process or device)."""
        if not m.ready or m.heartbeat is None:
            return False
        return time.time() - m.heartbeat > max(self.config.hang_seconds, HEARTBEAT_STALE_SECONDS)

    def _read_status(self, m: Managed) -> bool:
        """Refresh what the replica reports of itself; False when it has reported nothing."""
        raw = self.redis.hgetall(status_key(m.replica_id))
        if not raw:
            return False
        try:
            reported = ReplicaStatus.from_hash(raw)
        except ProtocolError as exc:
            log.warning("replica %s: unreadable status hash (%s)", m.replica_id, exc)
            return False
        # What the control worker mirrors into the database (a garbled value reads as empty).
        status = {key: value for key in ("load", "endpoint", "progress") if (value := getattr(reported, key))}
        m.status = status
        if reported.heartbeat:
            m.heartbeat = reported.heartbeat
        if reported.state == "ready" and not m.ready:
            m.ready = True
            self._event(m, "ready", pid=m.process.pid, status=status)
        return True
