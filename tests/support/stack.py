"""Real Switchyard processes for integration tests: web (uvicorn), the control Celery worker and
a node agent, all on the test database and Redis; and the steps every stack's fixture takes
around them (the demo model, the node online, a deployment's replicas ready, the web server up),
which tests/support/platform.py puts together for a module. Bounded waits only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import httpx
import redis
from django.conf import settings

from workers.bench.processes import ROOT, stop
from workers.demo import MODEL_DIR
from workers.protocol import replica as protocol


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
    proc = subprocess.Popen(
        [*AGENT_COMMAND, node],
        cwd=ROOT,
        env=agent_env({**env, "SWITCHYARD_NODE": node}),
        stdout=logf,
        stderr=subprocess.STDOUT,
    )
    return proc, logf


def web_command(port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", "controlplane.config.asgi:application", "--host", "127.0.0.1",
            "--port", str(port), "--no-access-log"]  # fmt: skip


def start_web(state_dir: Path, port: int, env: dict, log_name: str = "web") -> tuple[subprocess.Popen, object]:
    """A web process besides the one `processes` starts (with other settings, say)."""
    logf = open(state_dir / f"{log_name}.log", "wb")  # noqa: SIM115 - closed by the caller's stop()
    proc = subprocess.Popen(web_command(port), cwd=ROOT, env=env, stdout=logf, stderr=subprocess.STDOUT)
    return proc, logf


def web_up(base: str) -> bool:
    """The web process answers its health check (its database and Redis reachable)."""
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_web(base: str, timeout: float = 30) -> None:
    wait_for(lambda: web_up(base), timeout, f"the web server at {base}")


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
        commands["web"] = web_command(web_port)
        env.setdefault("GATEWAY_URL", f"http://127.0.0.1:{web_port}")  # the batch dispatcher's
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


# -- the platform's state, as the tests set it up and read it ------------------------------------
@contextmanager
def committed(django_db_blocker):
    """For a module-scoped stack: what the fixture writes is committed (the stack's processes
    read it, outside each test's transaction) and flushed once the module is done."""
    from django.core.management import call_command

    with django_db_blocker.unblock():
        try:
            yield
        finally:
            # Also when the setup failed: left committed, its rows (the model's name, the
            # deployments' slugs) would fail the next module's setup as well.
            call_command("flush", interactive=False, verbosity=0)


def demo_model(name: str = "demo-model"):
    """The demo model, registered and validated here (the stack's processes only read it)."""
    from controlplane.catalog.services import register_model, validate_model

    model = validate_model(register_model(name=name, source=str(MODEL_DIR)).pk)
    assert model.status == "ready", model.status_message
    return model


def wait_online(node: str, timeout: float = 60) -> None:
    from controlplane.inventory.models import Node

    wait_for(lambda: Node.objects.filter(name=node, status="online").exists(), timeout, f"the agent of {node}")


def wait_ready(slug: str, n: int, timeout: float) -> list:
    """The deployment's ready replicas, once there are exactly `n`."""
    from controlplane.deployments.models import Replica

    def ready():
        replicas = list(Replica.objects.filter(deployment__slug=slug, state="ready"))
        return replicas if len(replicas) == n else None

    return wait_for(ready, timeout, f"{n} ready replica(s) of {slug}")


def replica_status(replica_id: int) -> dict:
    """The status hash a replica heartbeats into the test Redis."""
    return redis.Redis.from_url(settings.REDIS_URL, decode_responses=True).hgetall(protocol.status_key(replica_id))


def replica_load(replica_id: int) -> dict:
    return json.loads(replica_status(replica_id).get("load") or "{}")


def scrape(base: str) -> list:
    """One read of the web process's /metrics, as samples (read several values from one scrape
    when they must agree: each scrape sees the replicas' latest heartbeats)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(base + "/metrics", timeout=10).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def sample_sum(samples: list, name: str, **labels) -> float:
    """The sum of the samples called `name` with these labels."""
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def metric(base: str, name: str, **labels) -> float:
    """The sum of the web process's /metrics samples called `name` with these labels."""
    return sample_sum(scrape(base), name, **labels)


def replica_request(client: redis.Redis, replica_id: int, params: dict, timeout: float = 30, **prompt) -> list[dict]:
    """Send one `generate` straight to a replica's request stream (as the gateway does), `prompt`
    being `prompt=` text or `prompt_token_ids=`; its events up to the one that finishes it. An
    error event fails the test."""
    rid, channel = f"t-{uuid.uuid4().hex[:8]}", f"reply-{uuid.uuid4().hex[:8]}"
    pubsub = client.pubsub()
    pubsub.subscribe(channel)
    pubsub.get_message(timeout=1)
    message = {"type": "generate", "id": rid, "reply_to": channel, "params": params, **prompt}
    client.xadd(protocol.requests_key(replica_id), {"m": json.dumps(message)})
    events: list[dict] = []
    try:
        while True:
            m = pubsub.get_message(timeout=timeout)
            assert m is not None, "no reply from the replica"
            if m["type"] != "message":
                continue
            events.append(json.loads(m["data"]))
            assert events[-1]["type"] != "error", events[-1]
            if events[-1].get("finish_reason"):
                return events
    finally:
        pubsub.close()
