"""`make run` (`python -m scripts.run`) end to end, three times on one state directory (SQLite,
the default): each run says it is running only once the demo replica answered, serves chat
completions with the API key of the first run, and stops every process on SIGINT / SIGTERM; a
killed control worker and a killed node agent are restarted and the stack keeps serving; a run
whose replica cannot serve says what failed and exits non-zero. Slow (a real stack per run):
bounded waits, and every process a run started is ended even when an assertion fails."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psutil
import pytest
from django.conf import settings

from tests.support.stack import wait_for
from workers.bench.processes import ROOT, free_port

pytestmark = pytest.mark.timeout(600)
RUNNING_WITHIN = 180


class MakeRun:
    """One `python -m scripts.run`, its output collected line by line."""

    def __init__(self, env: dict, state_dir: Path, args: tuple[str, ...] = ()):
        self.state_dir = state_dir
        self.proc = subprocess.Popen([sys.executable, "-m", "scripts.run", *args], cwd=ROOT, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    @property
    def output(self) -> str:
        with self.changed:
            return "\n".join(self.lines)

    def wait_line(self, pattern: str, timeout: float) -> str:
        """The first output line matching `pattern`; fails at once if make run exits first."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                found = next((line for line in self.lines if regex.search(line)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self.reader.is_alive()):
                    lines = "\n".join(self.lines)
                    raise AssertionError(f"no line matching {pattern!r} (exit {self.proc.poll()}):\n{lines}")
                self.changed.wait(min(left, 1.0))

    def children(self, marker: str) -> list[psutil.Process]:
        return [c for c in psutil.Process(self.proc.pid).children() if marker in " ".join(c.cmdline())]

    def stop(self, sig: int = signal.SIGINT, timeout: float = 90) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        return code


def leftovers(state_dir: Path) -> list[int]:
    """Processes started for this state directory (every one inherits it in its environment)."""
    marker = f"SWITCHYARD_STATE_DIR={state_dir}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "environ").read_bytes() and (entry / "stat").read_text().split()[2] != "Z":
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def assert_all_gone(state_dir: Path, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while (left := leftovers(state_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    described = []
    for pid in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            p = psutil.Process(pid)
            described.append(f"{pid} ({p.status()}, parent {p.ppid()}): {' '.join(p.cmdline())[:160]}")
    assert not left, "left running after make run stopped:\n" + "\n".join(described)


def end_leftovers(state_dir: Path) -> None:
    for pid in leftovers(state_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def run_env(state_dir: Path, **overrides) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_ROOTS", "SECRET_KEY", "DATABASE_URL")}
    return {
        **env,
        "SWITCHYARD_STATE_DIR": str(state_dir),
        "DATABASE_URL": f"sqlite:///{state_dir / 'db.sqlite3'}",
        "REDIS_URL": settings.REDIS_URL,
        "PORT": str(free_port()),
        "SWITCHYARD_NODE": f"mr-{uuid.uuid4().hex[:6]}",
        "CHANNELS_PREFIX": f"mr{uuid.uuid4().hex[:6]}",
        "KV_STORE_PORT": str(free_port()),  # its mooncake_master's (another stack may hold the default)
        "PYTHONPATH": str(ROOT),
        **overrides,
    }


def chat(url: str, api_key: str) -> httpx.Response:
    return httpx.post(f"{url}v1/chat/completions", headers={"Authorization": f"Bearer {api_key}"}, timeout=60,
                      json={"model": "demo", "messages": [{"role": "user", "content": "What is the capital of Japan?"}],
                            "max_tokens": 12, "temperature": 0})  # fmt: skip


def assert_serves(url: str, api_key: str) -> None:
    answer = chat(url, api_key)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]


def management_token(env: dict) -> str:
    return subprocess.run([sys.executable, "manage.py", "create_token", "admin", "--name", "test"], cwd=ROOT,
                          env=env, capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip


def assert_nothing_locked(state_dir: Path) -> None:
    for path in state_dir.rglob("*.log"):
        assert b"database is locked" not in path.read_bytes(), path


def serve_until_running(env: dict, state_dir: Path) -> tuple[MakeRun, dict]:
    run = MakeRun(env, state_dir)
    run.wait_line(r"^Switchyard is running\.$", RUNNING_WITHIN)
    info = json.loads((state_dir / "run.json").read_text())
    assert (state_dir / "run.json").stat().st_mode & 0o777 == 0o600
    assert info["url"] == f"http://127.0.0.1:{env['PORT']}/"
    assert f"API key       : {info['api_key']}" in run.output
    return run, info


def stop_cleanly(run: MakeRun, state_dir: Path, sig: int = signal.SIGINT) -> None:
    assert run.stop(sig) == 0, run.output
    assert "[switchyard] stopping..." in run.output
    assert_all_gone(state_dir)


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    """One state directory for the module's runs; the first run made and stopped."""
    state_dir = tmp_path_factory.mktemp("make-run") / "state"
    env = run_env(state_dir)
    try:
        run, info = serve_until_running(env, state_dir)
        assert "created the admin user 'admin'" in run.output and "created an API key" in run.output
        assert_serves(info["url"], info["api_key"])
        stop_cleanly(run, state_dir)
        yield state_dir, env, info
    finally:
        end_leftovers(state_dir)


def test_a_second_run_serves_with_the_same_admin_password_and_api_key(state):
    state_dir, env, first = state
    try:
        run, info = serve_until_running(env, state_dir)
        assert info == first
        assert "reusing the admin user, password and API key" in run.output
        assert "ROTATED" not in run.output and "created" not in run.output
        assert_serves(info["url"], first["api_key"])
        # Its own mooncake_master, which the control plane knows: a cache policy may use the store.
        assert f"started kvstore: mooncake_master on 127.0.0.1:{env['KV_STORE_PORT']}" in run.output
        assert "started kvpool: 512 MiB of KV store memory" in run.output  # the store's memory
        policy = httpx.post(
            f"{info['url']}api/v1/cache-policies/",
            json={"name": "shared", "store_tier": True},
            headers={"Authorization": f"Bearer {management_token(env)}"},
            timeout=30,
        )
        assert policy.status_code == 201, policy.text
        with httpx.Client(base_url=info["url"], timeout=30) as console:  # the printed password signs in
            console.get("/api/v1/auth/me/")
            signed_in = console.post(
                "/api/v1/auth/login/",
                headers={"X-CSRFToken": console.cookies["csrftoken"]},
                json={"username": "admin", "password": first["admin_password"]},
            )
            assert signed_in.status_code == 200, signed_in.text
        stop_cleanly(run, state_dir, signal.SIGTERM)
        assert_nothing_locked(state_dir)
    finally:
        end_leftovers(state_dir)


def _replaced(run: MakeRun, marker: str, old_pid: int) -> psutil.Process | None:
    found = [p for p in run.children(marker) if p.pid != old_pid]
    return found[0] if found else None


def test_a_killed_control_worker_and_node_agent_are_restarted_and_the_stack_keeps_serving(state):
    state_dir, env, first = state
    logs = state_dir / "logs"
    try:
        run, info = serve_until_running(env, state_dir)
        assert info["api_key"] == first["api_key"]
        assert_serves(info["url"], first["api_key"])
        token = management_token(env)

        def heartbeat_after(moment: datetime):
            nodes = httpx.get(
                f"{info['url']}api/v1/nodes/?name={env['SWITCHYARD_NODE']}",
                timeout=10,
                headers={"Authorization": f"Bearer {token}"},
            ).json()["results"]
            return nodes and datetime.fromisoformat(nodes[0]["last_heartbeat"]) > moment

        # The control worker: killed, restarted after 1 s, and applying the agent's reports again
        # (the node's heartbeat is written by the control worker alone).
        (control,) = run.children("-Q control")
        control.kill()
        run.wait_line(r"^\[switchyard\] control exited with code -9; restarting in 1s", 30)
        wait_for(lambda: _replaced(run, "-Q control", control.pid), 30, "a new control worker")
        restarted = datetime.now(UTC)
        wait_for(lambda: heartbeat_after(restarted), 60, "a heartbeat applied by the new control worker")
        assert "control exited with code -9; restarting in 1s" in (logs / "control.log").read_text()

        # The node agent: killed (its replica keeps running), restarted, and it adopts the replica.
        agent_log_size = (logs / "agent.log").stat().st_size
        (agent,) = run.children("workers.agent")
        agent.kill()
        run.wait_line(r"^\[switchyard\] agent exited with code -9; restarting in 1s", 30)
        wait_for(
            lambda: b"adopted replicas [" in (logs / "agent.log").read_bytes()[agent_log_size:],
            60,
            "the new agent to adopt the running replica",
        )
        assert_serves(info["url"], first["api_key"])  # the key of the first run, in the third
        stop_cleanly(run, state_dir)
        assert_nothing_locked(state_dir)
    finally:
        end_leftovers(state_dir)


def test_a_run_whose_replica_cannot_serve_says_what_failed_and_exits_non_zero(tmp_path):
    state_dir = tmp_path / "state"
    env = run_env(
        state_dir,
        REPLICA_COMMAND="{python} -c 'raise SystemExit(7)'",
        REPLICA_MAX_RESTARTS="1",
        REPLICA_BACKOFF_SECONDS="0.2",
        REPLICA_FAILURE_BUDGET="2",
    )
    try:
        run = MakeRun(env, state_dir)
        code = run.proc.wait(timeout=RUNNING_WITHIN)
        run.reader.join(timeout=10)
        assert code == 1, run.output
        assert "Switchyard is running" not in run.output
        failure = run.wait_line(r"^\[switchyard\] FAILED: ", 1)
        # Said once the deployment's failure budget is spent, not after RUN_READY_TIMEOUT (240 s).
        assert "the demo deployment gave up starting replicas: 2 replicas of generation" in failure
        assert f"log: {state_dir / 'logs' / 'replica-'}" in failure, failure
        assert "[switchyard] stopping..." in run.output
        assert_all_gone(state_dir)
        # What it made is kept for the next run all the same.
        assert json.loads((state_dir / "run.json").read_text())["api_key"].startswith("sy-")
    finally:
        end_leftovers(state_dir)
