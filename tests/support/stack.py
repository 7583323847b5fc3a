"""Real Switchyard processes for integration tests: web (uvicorn), the control Celery worker and
a node agent, all on the test database and Redis. Bounded waits only."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import redis
from django.conf import settings

from workers.bench.processes import ROOT, stop


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def database_url() -> str:
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) is not alive for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def stack_env(state_dir: Path, **overrides) -> dict:
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "SWITCHYARD_STATE_DIR": str(state_dir),
        "SECRET_KEY": settings.SECRET_KEY,  # sessions signed here must be valid there
        "MODEL_ROOTS": ",".join(settings.MODEL_ROOTS),  # models registered here are validated there
        "REPLICA_BACKOFF_SECONDS": "0.2",
        "REPLICA_STOP_TIMEOUT": "5",
        "NODE_HEARTBEAT_SECONDS": "0.5",
        "CELERY_TASK_DEFAULT_QUEUE": "control",
        "PYTHONPATH": str(ROOT),
        **overrides,
    }


AGENT_COMMAND = [sys.executable, "-m", "workers.agent", "--node"]


def agent_env(env: dict) -> dict:
    """A node agent needs Redis, not the database: give it a database URL that leads nowhere."""
    return {**env, "DATABASE_URL": "postgres://nobody@127.0.0.1:9/no-database-for-agents"}


def start_agent(state_dir: Path, node: str, env: dict, log_name: str = "agent") -> tuple[subprocess.Popen, object]:
    logf = open(state_dir / f"{log_name}.log", "ab")  # noqa: SIM115 - closed by the caller's stop()
    proc = subprocess.Popen([*AGENT_COMMAND, node], cwd=ROOT, env=agent_env({**env, "SWITCHYARD_NODE": node}),
                            stdout=logf, stderr=subprocess.STDOUT)  # fmt: skip
    return proc, logf


@contextmanager
def processes(state_dir: Path, node: str, env: dict, web_port: int | None = None, beat: bool = False):
    """Start the control worker, the node agent, (with `web_port`) uvicorn and (with `beat`)
    Celery beat; stop them all."""
    commands = {
        "control": [sys.executable, "-m", "celery", "-A", "controlplane.config", "worker", "-Q", "control",
                    "-P", "threads", "-c", "2", "-n", f"control-{node}@localhost", "--without-gossip",
                    "--without-mingle", "--loglevel", "INFO"],
        "agent": [*AGENT_COMMAND, node],
    }  # fmt: skip
    # SWITCHYARD_NODE set everywhere, as an operator may: only the agent becomes an agent.
    env = {**env, "SWITCHYARD_NODE": node}
    if web_port is not None:
        commands["web"] = [sys.executable, "-m", "uvicorn", "controlplane.config.asgi:application",
                           "--host", "127.0.0.1", "--port", str(web_port), "--no-access-log"]  # fmt: skip
    if beat:
        commands["beat"] = [sys.executable, "-m", "celery", "-A", "controlplane.config", "beat",
                            "--schedule", str(state_dir / "celerybeat-schedule"), "--loglevel", "WARNING"]  # fmt: skip
    # A fresh broker: what an earlier stack's agent sent while it stopped (a last node report,
    # replica events) would otherwise be applied by this stack's control worker, bringing that
    # node back as a ghost the reconciler could place replicas on.
    redis.Redis.from_url(env["REDIS_URL"]).flushdb()
    logs = {name: open(state_dir / f"{name}.log", "wb") for name in commands}  # noqa: SIM115
    procs = [
        subprocess.Popen(
            cmd, cwd=ROOT, env=agent_env(env) if name == "agent" else env, stdout=logs[name], stderr=subprocess.STDOUT
        )
        for name, cmd in commands.items()
    ]
    try:
        yield procs
    finally:
        stop(procs, logs.values(), timeout=20)
