"""`make run`: the whole control plane on this machine, in the foreground.

Starts Redis if none answers, the Mooncake Store's master (unless SWITCHYARD_KV_STORE_MASTER names
one), the web server (uvicorn, ASGI), Celery beat, the control worker and this machine's node
agent, and restarts any of them that dies (with a backoff); registers the demo model, deploys it
as `demo`, and says Switchyard is running only once the demo replica has answered a chat
completion through the gateway with the API key. The admin user, its
password and the API key are kept in .switchyard/run.json (mode 0600) and reused by the next
run while they still work. Ctrl-C (or SIGTERM) stops everything it started.

`make run MODEL=/path/to/hf-dir` (`--model DIR`) serves that directory instead of the demo: the
stack starts as usual (the directory added to MODEL_ROOTS for the processes it starts), then
`manage.py serve_model DIR` registers and deploys it under the directory's name (or NAME=) and
waits until it answers; the demo is neither created nor started (a demo deployment an earlier
run made keeps its state), so that the model the operator asked for has the devices.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

from controlplane.deployments.how_to_call import deployment_name, instructions
from workers.state_dir import make_private

ROOT = Path(__file__).resolve().parents[1]
STATE = Path(os.environ.get("SWITCHYARD_STATE_DIR", ROOT / ".switchyard"))
PY = sys.executable

RESTART_FIRST_DELAY = 1.0  # seconds before the first restart of a process that died
RESTART_MAX_DELAY = 30.0  # the delay doubles while a process keeps dying, up to this
STABLE_AFTER = 60.0  # a process that ran this long before dying starts again from the first delay
WEB_TIMEOUT, NODE_TIMEOUT = 60, 90


def log(msg: str) -> None:
    print(f"[switchyard] {msg}", flush=True)


class Stopping(Exception):
    """SIGINT / SIGTERM / SIGHUP: stop everything."""


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when make run itself dies, however it dies (a SIGKILL
    leaves no chance to stop anything), so no process outlives it."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Service:
    name: str
    args: list[str]
    log_path: Path
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    delay: float = 0.0  # the delay of the last restart (0: none yet, or it ran long enough)
    restart_at: float | None = None
    restarts: int = 0


@dataclass
class Supervisor:
    """Starts processes, restarts the ones that die (delay doubling from `first_delay` to
    `max_delay` while they keep dying within `stable_after` seconds), stops them all."""

    cwd: Path = ROOT
    say: Callable[[str], None] = log
    first_delay: float = RESTART_FIRST_DELAY
    max_delay: float = RESTART_MAX_DELAY
    stable_after: float = STABLE_AFTER
    services: list[Service] = field(default_factory=list)
    stopped: bool = False

    def start(self, name: str, args: list[str], log_path: Path) -> Service:
        service = Service(name, args, log_path)
        self.services.append(service)
        self._spawn(service)
        return service

    def _spawn(self, s: Service) -> None:
        with s.log_path.open("ab") as out:
            # Its own process group: a terminal's Ctrl-C reaches make run alone, which stops
            # the processes in order (the agent first, so that it drains its replicas).
            s.proc = subprocess.Popen(
                s.args,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                process_group=0,
                preexec_fn=_die_with_parent,
            )
        s.started_at, s.restart_at = time.monotonic(), None

    def _note(self, s: Service, message: str) -> None:
        self.say(message)
        with s.log_path.open("a") as out:
            out.write(f"[switchyard {datetime.now(UTC).isoformat(timespec='seconds')}] {message}\n")

    def tick(self) -> None:
        """Notice the processes that died and schedule their restart; restart those due."""
        now = time.monotonic()
        for s in self.services if not self.stopped else ():
            if s.restart_at is not None:
                if now >= s.restart_at:
                    s.restarts += 1
                    self._spawn(s)
                continue
            code = s.proc.poll() if s.proc else None
            if code is None:
                continue
            quick = now - s.started_at < self.stable_after
            s.delay = min(s.delay * 2, self.max_delay) if quick and s.delay else self.first_delay
            s.restart_at = now + s.delay
            message = f"{s.name} exited with code {code}; restarting in {s.delay:g}s"
            if s.delay >= self.max_delay:
                message += (
                    f" (it keeps dying within {self.stable_after:g}s of starting: restarted every "
                    f"{self.max_delay:g}s until it stays up; see {s.log_path})"
                )
            else:
                message += f" (log: {s.log_path})"
            self._note(s, message)

    def alive(self, name: str) -> subprocess.Popen | None:
        s = next((s for s in self.services if s.name == name), None)
        return s.proc if s and s.proc and s.proc.poll() is None else None

    def stop(self, names: tuple[str, ...] | None = None, timeout: float = 15.0) -> None:
        """SIGTERM the named processes (default: all left), wait up to `timeout` seconds, SIGKILL
        what is still there. Nothing is restarted after this."""
        self.stopped = True
        running = [
            s.proc for s in self.services if (names is None or s.name in names) and s.proc and s.proc.poll() is None
        ]
        for p in running:
            p.terminate()
        deadline = time.monotonic() + timeout
        for p in running:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def stop_stray_replicas(logs_dir: Path, timeout: float = 15.0) -> list[int]:
    """Replicas run in their own session so that they outlive a crashed agent (the next one
    adopts them). The agent stops them when it stops cleanly and forgets their pid files; a
    replica whose pid file is still there after the agent ended (killed, or out of time) is
    stopped here. Returns the pids it stopped."""
    import psutil

    strays = []
    for pid_file in logs_dir.glob("replica-*.pid"):
        replica_id = pid_file.stem.removeprefix("replica-")
        try:
            proc = psutil.Process(int(pid_file.read_text().split()[0]))
            # The pid may have been reused: only the replica itself is stopped.
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get("SWITCHYARD_REPLICA_ID") == replica_id:
                proc.terminate()
                strays.append(proc)
        except (OSError, ValueError, IndexError, psutil.Error):
            continue
    _, alive = psutil.wait_procs(strays, timeout=timeout)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return [p.pid for p in strays]


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def ensure_redis(url: str, sup: Supervisor, logs_dir: Path) -> str | None:
    """Start (and supervise) a redis-server if none answers at a local `url`; the problem if
    that cannot be done."""
    if redis_answers(url):
        return None
    parsed = urlparse(url)
    if parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
        return f"Redis at {url} does not answer; start it, or point REDIS_URL at one that does."
    binary = shutil.which("redis-server")
    if not binary:
        return (
            f"No Redis answers at {url} and redis-server is not installed. Install it "
            "(Debian: apt-get install redis-server; `make setup` does this as root) or set REDIS_URL."
        )
    port = parsed.port or 6379
    log(f"starting redis-server on port {port} (log: {logs_dir / 'redis.log'})")
    sup.start(
        "redis",
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        logs_dir / "redis.log",
    )
    deadline = time.monotonic() + 10
    while not redis_answers(url):
        if time.monotonic() > deadline:
            return f"redis-server did not answer within 10 s; see {logs_dir / 'redis.log'}"
        sup.tick()
        time.sleep(0.1)
    return None


def ensure_kv_store(sup: Supervisor, logs_dir: Path) -> str | None:
    """The Mooncake Store master a cache policy's `store_tier` uses: the operator's when
    SWITCHYARD_KV_STORE_MASTER is set, else a `mooncake_master` started (and supervised) here on
    127.0.0.1:KV_STORE_PORT (default 50051). Its address, exported for the web and control
    processes started after this; None when there is none. The store is optional: without it,
    make run serves all the same and a policy asking for it gets a 400 saying how to set it up."""
    from workers.kvtiers.master import MasterError, free_port, master_binary

    configured = os.environ.get("SWITCHYARD_KV_STORE_MASTER")
    if configured:
        log(f"KV store: the mooncake_master at {configured} (SWITCHYARD_KV_STORE_MASTER)")
        return configured
    port = int(os.environ.get("KV_STORE_PORT", "50051"))
    try:
        master_binary()
    except MasterError as exc:
        log(f"KV store: off ({exc})")
        return None
    if _listening(port):
        log(
            f"KV store: off (port {port} is taken; set KV_STORE_PORT to a free one, or SWITCHYARD_KV_STORE_MASTER "
            "to a running mooncake_master)"
        )
        return None
    # Its HTTP metrics port is of no use here: any free one.
    metrics_port = free_port()
    args = [PY, "-m", "workers.kvtiers.master", "--port", str(port), "--metrics-port", str(metrics_port)]
    sup.start("kvstore", args, logs_dir / "kvstore.log")
    address = f"127.0.0.1:{port}"
    if not wait(lambda: _listening(port), 10, sup, interval=0.1):
        log(
            f"KV store: mooncake_master did not listen on {address} within 10 s; see {logs_dir / 'kvstore.log'} "
            "(it is restarted like the other processes)"
        )
    else:
        log(f"started kvstore: mooncake_master on {address} (log: {logs_dir / 'kvstore.log'})")
    # The pool's memory: replicas lend none by default (KV_STORE_SEGMENT_BYTES=0), so that a
    # block outlives the replica that put it; this segment server holds it instead.
    pool_bytes = int(os.environ.get("KV_STORE_POOL_BYTES", str(512 << 20)))
    pool_port = free_port()
    pool = [PY, "-m", "workers.kvtiers.master", "pool", "--master", address, "--bytes", str(pool_bytes),
            "--port", str(pool_port)]  # fmt: skip
    sup.start("kvpool", pool, logs_dir / "kvpool.log")
    if wait(lambda: _listening(pool_port), 15, sup, interval=0.1):
        log(f"started kvpool: {pool_bytes >> 20} MiB of KV store memory (log: {logs_dir / 'kvpool.log'})")
    else:
        log(f"KV store: the pool's segment server did not start within 15 s; see {logs_dir / 'kvpool.log'}")
    os.environ["SWITCHYARD_KV_STORE_MASTER"] = address
    os.environ["SWITCHYARD_KV_STORE_METRICS"] = f"127.0.0.1:{metrics_port}"  # the pool's capacity and use
    return address


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def read_previous(run_file: Path) -> dict | None:
    try:
        previous = json.loads(run_file.read_text())
    except (OSError, ValueError):
        return None
    return previous if isinstance(previous, dict) else None


def write_private(path: Path, text: str) -> None:
    """Write `path` as 0600 from its first byte (then rename over the old one)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def bootstrap(previous: dict | None, log_path: Path, serve: str | None = None) -> tuple[dict | None, str]:
    """Run scripts.bootstrap (migrate, admin, API key, token, demo unless `serve` names the
    deployment served instead) with the previous run's credentials on stdin; (its result, "") or
    (None, what went wrong)."""
    args = [PY, "-m", "scripts.bootstrap", *(["--serve", serve] if serve else [])]
    with log_path.open("a") as err:
        done = subprocess.run(args, cwd=ROOT, input=json.dumps(previous), stdout=subprocess.PIPE, stderr=err, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = log_path.read_text().strip().splitlines()[-1:] if log_path.exists() else []
        return None, f"setting up the database failed (exit {done.returncode}: {' '.join(last)}); see {log_path}"
    return json.loads(lines[-1]), ""


def http(url: str, token: str | None = None, body: dict | None = None, timeout: float = 5) -> tuple[int, object]:
    """(status, parsed JSON or text); status 0 when nothing answered."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = None
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    except OSError as e:
        return 0, str(e)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def wait(check: Callable[[], object], timeout: float, sup: Supervisor, interval: float = 0.5) -> object:
    """Poll `check` until it returns something true or `timeout` passes, supervising meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        sup.tick()
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(interval)


def fresh_heartbeat(url: str, token: str, node: str, since: datetime) -> Callable[[], str | None]:
    """A check: the node's last heartbeat (ISO) once it is online with one newer than `since`,
    so that a row left `online` by an earlier run does not count."""

    def check():
        status, body = http(f"{url}api/v1/nodes/?name={node}", token)
        rows = body.get("results", []) if status == 200 and isinstance(body, dict) else []
        beat = rows[0].get("last_heartbeat") if rows and rows[0].get("status") == "online" else None
        return beat if beat and datetime.fromisoformat(beat) > since else None

    return check


def demo_ready(url: str, token: str) -> bool:
    status, body = http(f"{url}api/v1/replicas/?deployment__slug=demo&state=ready", token)
    return status == 200 and isinstance(body, dict) and bool(body.get("results"))


def demo_gave_up(url: str, token: str) -> str:
    """Why the demo deployment stopped starting replicas (its failure budget spent), or ""."""
    status, body = http(f"{url}api/v1/deployments/demo/", token)
    if status != 200 or not isinstance(body, dict):
        return ""
    return body.get("failed_reason") or ""


def replica_summary(url: str, token: str, logs_dir: Path) -> str:
    status, body = http(f"{url}api/v1/replicas/?deployment__slug=demo", token)
    if status != 200 or not isinstance(body, dict):
        return f"the replica list did not answer ({status})"
    parts = []
    for r in body.get("results", [])[:5]:
        error = f", {r['last_error'].strip().splitlines()[-1]}" if r.get("last_error") else ""
        replica_log = logs_dir / f"replica-{r['id']}.log"
        parts.append(f"replica {r['id']} {r['state']}{error} (log: {replica_log})")
    return "; ".join(parts) or "no replica was created (see the deployment's placement_error)"


@dataclass
class OwnModel:
    """`--model DIR`: the directory make run serves instead of the demo, and its deployment."""

    directory: Path
    name: str


def own_model(directory: str | None, name: str | None) -> OwnModel | str | None:
    """The model to serve, or what is wrong with the arguments (the directory's files are
    checked by serve_model, with the control plane's own checks)."""
    if directory is None:
        return None
    path = Path(directory).expanduser()
    if not path.is_dir():
        return f"MODEL={directory}: no such directory"
    path = path.resolve()
    return OwnModel(path, name or deployment_name(path))


def allow_model_root(directory: Path) -> None:
    """The directory the operator named on the command line may be registered: added to the
    MODEL_ROOTS every process started from here reads (settings.py's defaults kept)."""
    roots = os.environ.get("MODEL_ROOTS") or f"{ROOT / 'workers' / 'demo'},{STATE / 'models'}"
    if str(directory) not in roots.split(","):
        os.environ["MODEL_ROOTS"] = f"{roots},{directory}"


def serve_model(model: OwnModel, url: str, timeout: float, sup: Supervisor) -> int:
    """`manage.py serve_model` for `model`, its progress shown as it goes, supervising meanwhile;
    its exit code. Stopped with make run (its own process group, like the services)."""
    args = [PY, "manage.py", "serve_model", str(model.directory), "--name", model.name, "--wait-timeout",
            f"{timeout:g}", "--url", url, "--no-instructions"]  # fmt: skip
    proc = subprocess.Popen(args, cwd=ROOT, stdin=subprocess.DEVNULL, process_group=0, preexec_fn=_die_with_parent)
    try:
        wait(lambda: proc.poll() is not None, timeout + 120, sup, interval=0.2)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", metavar="DIR", help="serve this Hugging Face model directory instead of the demo")
    parser.add_argument("--name", help="its deployment's name (default: the directory's name)")
    args = parser.parse_args(argv)
    model = own_model(args.model, args.name)
    if isinstance(model, str):
        log(f"FAILED: {model}")
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.config.settings")
    # Owner-only state directory, and a 077 umask inherited by every process started below.
    make_private(STATE)
    started = datetime.now(UTC)
    sup = Supervisor()
    stopping = False

    def on_signal(signum, _frame):
        nonlocal stopping
        if not stopping:  # a second Ctrl-C while stopping changes nothing: the waits are bounded
            stopping = True
            raise Stopping

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    if model is not None:
        allow_model_root(model.directory)
    try:
        return run(sup, started, model)
    except Stopping:
        return 0
    finally:
        stopping = True
        log("stopping...")
        # The agent first (it drains and stops its replicas, and says it is leaving while the
        # control worker can still record it), with time for its replicas' drain; then any
        # replica it left; Redis, if it is ours, last.
        sup.stop(("agent",), timeout=float(os.environ.get("REPLICA_STOP_TIMEOUT", "10")) + 20)
        for pid in stop_stray_replicas(STATE / "logs"):
            log(f"stopped replica process {pid}, left running by the node agent")
        sup.stop(tuple(s.name for s in sup.services if s.name != "redis"))
        sup.stop()
        log("stopped")


def run(sup: Supervisor, started: datetime, model: OwnModel | None = None) -> int:
    port = int(os.environ.get("PORT", "8000"))
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    node = os.environ.get("SWITCHYARD_NODE") or socket.gethostname().split(".")[0]
    logs_dir = STATE / "logs"
    run_file = STATE / "run.json"
    # How long the demo replica may take to load and answer (a big model on a GPU: raise it).
    serve_timeout = float(os.environ.get("RUN_READY_TIMEOUT", "240"))

    def failed(message: str) -> int:
        log(f"FAILED: {message}")
        return 1

    problem = ensure_redis(redis_url, sup, logs_dir)
    if problem:
        return failed(problem)
    log("applying migrations, checking the admin user and API key")
    previous = read_previous(run_file)
    creds, problem = bootstrap(previous, logs_dir / "bootstrap.log", model.name if model else None)
    if creds is None:
        return failed(problem)
    url = f"http://127.0.0.1:{port}/"
    user, password, api_key = creds["admin_user"], creds["admin_password"], creds["api_key"]
    # Written before anything can fail, so that a new key is never lost. A password the operator
    # changed (None) leaves run.json's as it was: a later run then still knows not to reset it.
    kept = password if password is not None else (previous or {}).get("admin_password")
    info = {"url": url, "admin_user": user, "admin_password": kept, "api_key": api_key,
            "model": model.name if model else "demo", "demo_defaults": creds.get("demo_defaults", 0)}  # fmt: skip
    write_private(run_file, json.dumps(info, indent=2))
    for note in creds["notes"]:
        log(note)
    if previous and not creds["notes"]:
        log(f"reusing the admin user, password and API key from {run_file}")

    ensure_kv_store(sup, logs_dir)  # before web and control: they read its address from the environment
    os.environ.setdefault("GATEWAY_URL", f"http://127.0.0.1:{port}")  # where the batch dispatcher sends lines
    celery = [PY, "-m", "celery", "-A", "controlplane.config"]
    services = {
        "web": [PY, "-m", "uvicorn", "controlplane.config.asgi:application", "--host", "127.0.0.1",
                "--port", str(port), "--log-level", "warning"],
        "beat": [*celery, "beat", "--schedule", str(STATE / "celerybeat-schedule"), "--loglevel", "WARNING"],
        "control": [*celery, "worker", "-Q", "control", "-P", "threads", "-c", "2", "-n", "control@%h",
                    "--without-gossip", "--without-mingle", "--loglevel", "INFO"],
        "agent": [PY, "-m", "workers.agent", "--node", node],
    }  # fmt: skip
    for name, args in services.items():
        sup.start(name, args, logs_dir / f"{name}.log")
        log(f"started {name} (log: {logs_dir / (name + '.log')})")

    health = wait(lambda: http(f"{url}healthz")[0] == 200, WEB_TIMEOUT, sup)
    if not health:
        return failed(f"the web server did not answer {url}healthz within {WEB_TIMEOUT} s; see {logs_dir / 'web.log'}")
    beat = wait(fresh_heartbeat(url, creds["token"], node, started), NODE_TIMEOUT, sup)
    if not beat:
        return failed(
            f"node agent {node!r} sent no heartbeat since this run started ({NODE_TIMEOUT} s); see "
            f"{logs_dir / 'agent.log'} and {logs_dir / 'control.log'}"
        )
    log(f"node agent {node}: online (heartbeat {beat})")
    if model is not None:
        log(f"serving {model.directory} as {model.name!r} (manage.py serve_model)")
        code = serve_model(model, url, serve_timeout, sup)
        if code != 0:
            return failed(f"serving {model.directory} did not succeed (serve_model exit {code}; its error is above)")
        print_running(url, user, password, api_key, run_file, logs_dir, instructions(url, api_key, model.name))
        return forever(sup)
    log("waiting for the demo replica to answer a chat completion")
    attempt = {"last": "", "next_report": time.monotonic() + 30, "gave_up": ""}
    probe = {"model": "demo", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1}

    def answers():
        if not demo_ready(url, creds["token"]):  # asked first: each 503 would be an error line in web.log
            attempt["last"] = "no demo replica is ready yet"
            attempt["gave_up"] = demo_gave_up(url, creds["token"])
            return bool(attempt["gave_up"]) or report_now()  # no replica will come: say so now
        status, body = http(f"{url}v1/chat/completions", api_key, probe, timeout=30)
        if status == 200 and isinstance(body, dict) and body.get("choices"):
            return True
        error = body.get("error", {}).get("message") if isinstance(body, dict) else body
        attempt["last"] = f"{status}: {error}"
        return report_now()

    def report_now() -> bool:
        if time.monotonic() > attempt["next_report"]:
            attempt["next_report"] = time.monotonic() + 30
            log(f"still waiting ({attempt['last']}); {replica_summary(url, creds['token'], logs_dir)}")
        return False

    done = wait(answers, serve_timeout, sup, interval=1)
    if done and attempt["gave_up"]:
        return failed(
            f"the demo deployment gave up starting replicas: {attempt['gave_up']}; "
            f"{replica_summary(url, creds['token'], logs_dir)}"
        )
    if not done:
        return failed(
            f"the demo deployment did not answer a chat completion within {serve_timeout:g} s (last answer "
            f"{attempt['last']}); {replica_summary(url, creds['token'], logs_dir)}"
        )
    demo = f"""Try the demo model:
  curl {url}v1/chat/completions -H "Authorization: Bearer {api_key}" -H "Content-Type: application/json" \\
    -d '{{"model": "demo", "messages": [{{"role": "user", "content": "What is the capital of Japan?"}}]}}'"""
    print_running(url, user, password, api_key, run_file, logs_dir, demo)
    return forever(sup)


def print_running(
    url: str, user: str, password: str | None, api_key: str, run_file: Path, logs_dir: Path, how_to_call: str
) -> None:
    # create_token must find this run's database: the same state directory (or DATABASE_URL)
    state_env = "".join(
        f"{name}={shlex.quote(os.environ[name])} "
        for name in ("SWITCHYARD_STATE_DIR", "DATABASE_URL")
        if os.environ.get(name)
    )
    shown = password or "(changed since make run set it; `manage.py changepassword admin` sets one)"
    print(
        f"""
Switchyard is running.
  console / API : {url}   (API docs: {url}api/docs/)
  admin         : {user} / {shown}
  API key       : {api_key}
  management API: TOKEN=$({state_env}.venv/bin/python manage.py create_token {user})
                  curl -H "Authorization: Bearer $TOKEN" {url}api/v1/nodes/
  written to    : {run_file}
{how_to_call}
A process that dies is restarted (see the logs in {logs_dir}). Press Ctrl-C to stop everything.""",
        flush=True,
    )


def forever(sup: Supervisor) -> int:
    while True:
        sup.tick()
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
