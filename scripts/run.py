"""`make run`: the whole control plane on this machine, in the foreground.

Starts (and on Ctrl-C stops) Redis if none answers, the web server (uvicorn, ASGI), Celery
beat, the control worker and this machine's node agent; registers the demo model, deploys it
as `demo` and waits for its replica; prints where to go, how to sign in and a curl example,
and writes the same to .switchyard/run.json (mode 0600).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from workers.state_dir import make_private

ROOT = Path(__file__).resolve().parents[1]
STATE = Path(os.environ.get("SWITCHYARD_STATE_DIR", ROOT / ".switchyard"))
PY = sys.executable


def log(msg: str) -> None:
    print(f"[switchyard] {msg}", flush=True)


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def ensure_redis(url: str, procs: list) -> None:
    if redis_answers(url):
        return
    parsed = urlparse(url)
    if parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
        sys.exit(f"Redis at {url} does not answer; start it, or point REDIS_URL at one that does.")
    binary = shutil.which("redis-server")
    if not binary:
        sys.exit(
            f"No Redis answers at {url} and redis-server is not installed. Install it "
            "(Debian: apt-get install redis-server; `make setup` does this as root) or set REDIS_URL."
        )
    port = parsed.port or 6379
    log(f"starting redis-server on port {port}")
    procs.append(
        (
            "redis",
            subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL,
            ),
        )
    )
    deadline = time.monotonic() + 10
    while not redis_answers(url):
        if time.monotonic() > deadline:
            sys.exit("redis-server did not start within 10 s")
        time.sleep(0.1)


BOOTSTRAP = """
import json, sys
import django
django.setup()
from django.core.management import call_command
from django.contrib.auth import get_user_model
from controlplane.common.services import create_token, revoke_tokens
from controlplane.catalog.models import Model
from controlplane.catalog.services import register_model, validate_model
from controlplane.deployments import services as deployments
from controlplane.deployments.models import Deployment
from controlplane.gateway.models import ApiKey
from controlplane.gateway.services import create_api_key
from workers.demo import MODEL_DIR

call_command("migrate", "--noinput", verbosity=0)
user, _ = get_user_model().objects.get_or_create(username="admin")
user.is_staff = user.is_superuser = True
user.set_password(sys.argv[1])
user.save()
ApiKey.objects.filter(owner=user, name="make-run", revoked=False).update(revoked=True)
_, secret = create_api_key(name="make-run", owner=user)
model = Model.objects.filter(name="demo").first() or register_model(name="demo", source=str(MODEL_DIR), actor=user)
model = validate_model(model.pk)
if model.status != "ready":
    sys.exit(f"the demo model at {MODEL_DIR} is not usable: {model.status_message}")
demo = Deployment.objects.filter(slug="demo").first()
if demo is None:
    deployments.create_deployment({"slug": "demo", "model": model, "replicas": 1}, actor=user)
elif demo.desired_state != "running":
    deployments.start(demo, actor=user)
# The token this script polls the API with; only its hash is kept, so a fresh one each run.
revoke_tokens(user, name="make-run")
_, token = create_token(user, name="make-run")
print(json.dumps({"api_key": secret, "token": token}))
"""


def bootstrap() -> dict:
    """Migrate, then (re)create the admin with a fresh password (so the printed one always
    works), an API key and a management-API token, register the demo model and create the
    `demo` deployment (or start it again); one Django start-up for all of it."""
    password = secrets.token_urlsafe(12)
    out = subprocess.run([PY, "-c", BOOTSTRAP, password], cwd=ROOT, check=True, capture_output=True, text=True)
    return {"admin_user": "admin", "admin_password": password, **json.loads(out.stdout.strip().splitlines()[-1])}


def wait_http(url: str, timeout: float, token: str | None = None, until=lambda body: True) -> bool:
    """Poll `url` until it answers 200 and `until(parsed JSON body)` holds."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200 and until(json.loads(response.read())):
                    return True
        except OSError:
            pass
        time.sleep(0.3)
    return False


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.config.settings")
    # Owner-only state directory, and a 077 umask inherited by every process started below.
    make_private(STATE)
    port = int(os.environ.get("PORT", "8000"))
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    node = os.environ.get("SWITCHYARD_NODE") or socket.gethostname().split(".")[0]
    procs: list[tuple[str, subprocess.Popen]] = []
    logs_dir = STATE / "logs"

    def start(name: str, args: list[str]) -> None:
        out = (logs_dir / f"{name}.log").open("ab")
        procs.append((name, subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)))
        log(f"started {name} (log: {logs_dir / (name + '.log')})")

    def stop_all(*_):
        log("stopping...")
        for _name, p in reversed(procs):
            if p.poll() is None:
                p.terminate()
        for _name, p in reversed(procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        sys.exit(0)

    signal.signal(signal.SIGINT, stop_all)
    signal.signal(signal.SIGTERM, stop_all)
    ensure_redis(redis_url, procs)
    log("applying migrations, creating the admin user")
    creds = bootstrap()
    celery = [PY, "-m", "celery", "-A", "controlplane.config"]
    start("web", [PY, "-m", "uvicorn", "controlplane.config.asgi:application", "--host", "127.0.0.1",
                  "--port", str(port), "--log-level", "warning"])  # fmt: skip
    start("beat", [*celery, "beat", "--schedule", str(STATE / "celerybeat-schedule"), "--loglevel", "WARNING"])
    start("control", [*celery, "worker", "-Q", "control", "-P", "threads", "-c", "2", "-n", "control@%h",
                      "--without-gossip", "--without-mingle", "--loglevel", "INFO"])  # fmt: skip
    start("agent", [PY, "-m", "workers.agent", "--node", node])
    url = f"http://127.0.0.1:{port}/"
    if not wait_http(f"{url}healthz", 60):
        log("the web server did not come up; see .switchyard/logs/web.log")
        stop_all()
    registered = wait_http(f"{url}api/v1/nodes/?name={node}&status=online", 60, creds["token"],
                           until=lambda body: body["count"] > 0)  # fmt: skip
    log(f"node agent {node}: {'registered' if registered else 'NOT registered (see logs/agent.log)'}")
    log("waiting for the demo deployment's replica to load the model")
    ready = wait_http(f"{url}api/v1/replicas/?deployment__slug=demo&state=ready", 180, creds["token"],
                      until=lambda body: body["count"] > 0)  # fmt: skip
    if not ready:
        log("the demo replica is not ready after 180 s; see .switchyard/logs/replica-*.log")
    user, password, api_key = creds["admin_user"], creds["admin_password"], creds["api_key"]
    info = {"url": url, "admin_user": user, "admin_password": password, "api_key": api_key, "model": "demo"}
    run_file = STATE / "run.json"
    run_file.write_text(json.dumps(info, indent=2))
    run_file.chmod(0o600)
    print(
        f"""
Switchyard is running.
  console / API : {url}   (API docs: {url}api/docs/)
  admin         : {user} / {password}
  API key       : {api_key}
  management API: TOKEN=$(.venv/bin/python manage.py create_token {user})
                  curl -H "Authorization: Bearer $TOKEN" {url}api/v1/nodes/
  written to    : {run_file}
Try the demo model:
  curl {url}v1/chat/completions -H "Authorization: Bearer {api_key}" -H "Content-Type: application/json" \\
    -d '{{"model": "demo", "messages": [{{"role": "user", "content": "What is the capital of Japan?"}}]}}'
Press Ctrl-C to stop everything.""",
        flush=True,
    )
    while True:
        for name, p in procs:
            if p.poll() is not None:
                log(f"{name} exited with code {p.returncode}; see {logs_dir / (name + '.log')}")
                stop_all()
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
