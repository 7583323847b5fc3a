"""Serve a model directory in one step (`manage.py serve_model`, and `make run MODEL=...` through
it): check the directory, register it as a model, create (or reuse) a deployment named after
it, find an API key for it, wait for a replica to be ready and answer, and say how to call it.

Every step is idempotent: a second run with the same directory finds the model, the deployment
and the key it made the first time. A name already taken by another directory (or another
model's deployment) is refused rather than reused. What the operator must fix is a
`ServeError` with the reason in words.
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model

from controlplane.catalog import validation
from controlplane.catalog.models import Model
from controlplane.catalog.services import register_model, validate_model
from controlplane.common.errors import DomainError
from controlplane.deployments import services as deployments
from controlplane.deployments.models import Deployment, Replica
from controlplane.gateway.services import authenticate, create_api_key
from workers.protocol.draft_models import is_eagle3

KEY_NAME = "serve-model"
# The settings `serve_model` may give the deployment (the REST API has them all).
DEPLOYMENT_OPTIONS = ("replicas", "max_model_len", "max_num_seqs", "dtype")


class ServeError(Exception):
    """What stops a model from being served, for the operator."""


@dataclass
class Served:
    deployment: Deployment
    api_key: str
    notes: list[str]


def check_directory(path: str | Path) -> Path:
    """The model directory, resolved, if the engine can serve it; else a ServeError saying why."""
    directory = Path(path).expanduser()
    if not directory.exists():
        raise ServeError(f"{path}: no such directory")
    if not directory.is_dir():
        raise ServeError(
            f"{path} is not a directory (give the Hugging Face model directory: config.json, "
            "tokenizer.json and *.safetensors)"
        )
    directory = directory.resolve()
    try:
        if is_eagle3(validation.read_config(directory)):
            raise ServeError(
                f"{directory} is an EAGLE-3 draft head: it is not served on its own; serve its target "
                "model, then give the deployment this head as its draft_model"
            )
        validation.inspect_directory(directory)
    except validation.ModelDirectoryError as exc:
        raise ServeError(f"{directory} cannot be served: {exc}") from None
    try:
        validation.check_under_roots(str(directory), settings.MODEL_ROOTS)
    except validation.ModelDirectoryError as exc:
        raise ServeError(
            f"{exc}. Models are served only from under MODEL_ROOTS: move or copy it under one of them, or add "
            f"{directory.parent} to MODEL_ROOTS (comma-separated) for this command and for the web and control "
            f"processes; `make run MODEL={directory}` does that for the stack it starts"
        ) from None
    return directory


def operator(username: str | None):
    """The user the model, deployment and key are recorded as: `username`, else `admin` (make
    run's), else the first superuser."""
    users = get_user_model().objects
    if username:
        user = users.filter(username=username).first()
        if user is None:
            raise ServeError(f"no user named {username!r}")
        return user
    user = users.filter(username="admin").first() or users.filter(is_superuser=True).order_by("pk").first()
    if user is None:
        raise ServeError(
            "no admin user yet: run `make run` once (it creates one), `manage.py createsuperuser`, or pass --user"
        )
    return user


def ensure_model(directory: Path, name: str, user) -> tuple[Model, list[str]]:
    """The model registered from `directory` under `name`, validated (ready)."""
    model = Model.objects.filter(name=name).first()
    notes = []
    if model is not None and (model.source_type != Model.Source.LOCAL or Path(model.source).resolve() != directory):
        raise ServeError(
            f"a model named {name!r} is already registered from {model.source}; pass --name to serve "
            f"{directory} under another name"
        )
    if model is None:
        try:
            model = register_model(name=name, source=str(directory), actor=user)
        except DomainError as exc:
            raise ServeError(f"{directory} cannot be registered: {exc}") from None
        notes.append(f"registered model {name!r} from {directory} ({model.architecture})")
    # Validated here and now (the checksum is read), so a broken file is this command's error;
    # the control worker's validation task then finds it ready and leaves it.
    model = validate_model(model.pk)
    if model.status != Model.Status.READY:
        raise ServeError(f"model {name!r} ({directory}) failed validation: {model.status_message}")
    return model, notes


def ensure_deployment(model: Model, name: str, user, options: dict) -> tuple[Deployment, list[str]]:
    """The deployment `name` of `model`, running, with `options` (only those given) applied."""
    options = {k: v for k, v in options.items() if k in DEPLOYMENT_OPTIONS and v is not None}
    dep = Deployment.objects.filter(slug=name).first()
    try:
        if dep is None:
            dep = deployments.create_deployment({"slug": name, "model": model, "replicas": 1, **options}, actor=user)
            return dep, [f"created deployment {name!r}"]
        if dep.model_id != model.pk:
            raise ServeError(
                f"deployment {name!r} already serves model {dep.model.name!r} ({dep.model.source}); "
                "pass --name to choose another name"
            )
        notes = [f"reusing deployment {name!r}"]
        changed = {k: v for k, v in options.items() if getattr(dep, k) != v}
        if changed:
            dep = deployments.update_deployment(dep, changed, actor=user)
            notes.append("updated " + ", ".join(f"{k}={v}" for k, v in changed.items()))
            if dep.desired_state == Deployment.DesiredState.RUNNING and set(changed) - {"replicas"}:
                deployments.restart(dep, actor=user)  # running replicas roll onto the new settings
        if dep.desired_state != Deployment.DesiredState.RUNNING or dep.failed_at is not None:
            deployments.start(dep, actor=user)  # a failed one gets a fresh failure budget
            notes.append(f"started deployment {name!r}")
    except DomainError as exc:
        field = f" ({exc.field})" if exc.field else ""
        raise ServeError(f"deployment {name!r} cannot be created: {exc}{field}") from None
    dep.refresh_from_db()
    return dep, notes


def _key_files() -> list[Path]:
    return [settings.STATE_DIR / "run.json", settings.STATE_DIR / "serve_model.json"]


def ensure_api_key(user, dep: Deployment) -> tuple[str, list[str]]:
    """A key that may call `dep`: make run's (run.json) or the one this command made before
    (serve_model.json, 0600 in the state directory), while it still works; else a new one, kept
    there. Only a key's hash is in the database, so a key is reused only from those files."""
    for path in _key_files():
        try:
            secret = json.loads(path.read_text()).get("api_key")
        except (OSError, ValueError, AttributeError):
            continue
        key = authenticate(secret) if isinstance(secret, str) else None
        if key is not None and (
            not key.allowed_deployments.exists() or key.allowed_deployments.filter(pk=dep.pk).exists()
        ):
            return secret, []
    _, secret = create_api_key(name=KEY_NAME, owner=user, actor=user)
    path = _key_files()[1]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"api_key": secret}, f)
    return secret, [f"created an API key ({secret[:12]}…), kept in {path}"]


def serve(path: str | Path, name: str | None, username: str | None, options: dict) -> Served:
    """Everything but the wait: the model, the deployment and a key."""
    from controlplane.deployments.how_to_call import deployment_name

    directory = check_directory(path)
    name = name or deployment_name(directory)
    user = operator(username)
    model, notes = ensure_model(directory, name, user)
    dep, more = ensure_deployment(model, name, user, options)
    key, key_notes = ensure_api_key(user, dep)
    return Served(dep, key, notes + more + key_notes)


# -- waiting --------------------------------------------------------------------------------------
def _describe(r: Replica) -> str:
    where = f" on {r.node.name}" if r.node else ""
    progress = r.progress if isinstance(r.progress, dict) else {}
    stage = ""
    if r.state == Replica.State.STARTING and progress.get("stage"):
        try:
            stage = f" ({progress['stage']} {float(progress.get('fraction', 0)):.0%})"
        except (TypeError, ValueError):
            stage = f" ({progress['stage']})"
    return f"replica {r.pk}{where}: {r.state}{stage}"


def _milestone(r: Replica) -> tuple:
    """What a progress line is printed for: a new state, a new loading stage, a quarter more."""
    progress = r.progress if isinstance(r.progress, dict) and r.state == Replica.State.STARTING else {}
    fraction = progress.get("fraction")
    finite = isinstance(fraction, (int, float)) and math.isfinite(fraction)
    return r.state, progress.get("stage"), int(fraction * 4) if finite else None


def _logs_hint(r: Replica) -> str:
    path = settings.STATE_DIR / "logs" / f"replica-{r.pk}.log"
    error = r.last_error.strip().splitlines()[-1] if r.last_error.strip() else ""
    return (f": {error}" if error else "") + (f" (log: {path})" if path.exists() else "")


def wait_ready(dep: Deployment, timeout: float, say: Callable[[str], None], every: float = 15.0) -> Replica:
    """A ready replica of `dep`, saying what its replicas do meanwhile (each change, and a summary
    every `every` seconds); ServeError when the deployment gives up or `timeout` passes."""
    start = time.monotonic()
    seen: dict[int, tuple] = {}
    placement = ""
    next_summary = start + every
    while True:
        dep.refresh_from_db()
        replicas = list(dep.replica_set.select_related("node").filter(generation=dep.generation).order_by("pk"))
        for r in replicas:
            if seen.get(r.pk) != _milestone(r):  # not every percent of a long load
                seen[r.pk] = _milestone(r)
                say(_describe(r) + (_logs_hint(r) if r.state == Replica.State.FAILED else ""))
        if dep.placement_error != placement:
            placement = dep.placement_error
            if placement:
                say(placement)
        ready = next((r for r in replicas if r.state == Replica.State.READY), None)
        if ready is not None:
            return ready
        elapsed = time.monotonic() - start
        if dep.failed_at is not None:
            failed = [r for r in replicas if r.state == Replica.State.FAILED][-1:]
            raise ServeError(
                f"deployment {dep.slug!r} gave up starting replicas: {dep.failed_reason}"
                + "".join(_logs_hint(r) for r in failed)
            )
        if elapsed > timeout:
            states = "; ".join(_describe(r) + _logs_hint(r) for r in replicas) or "no replica was created"
            placement = f"; {dep.placement_error}" if dep.placement_error else ""
            raise ServeError(
                f"no replica of {dep.slug!r} was ready within {timeout:g} s ({states}{placement}); "
                "raise --wait-timeout for a large model"
            )
        if time.monotonic() > next_summary:
            next_summary += every
            waiting = dep.placement_error or ", ".join(_describe(r) for r in replicas) or "no replica placed yet"
            say(f"still waiting ({elapsed:.0f} s): {waiting}")
        time.sleep(0.5)


def _post(url: str, api_key: str, body: dict, timeout: float) -> tuple[int, object]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read())
        except ValueError:
            return e.code, None
    except (OSError, ValueError) as e:
        return 0, str(e)


def gateway_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/healthz", timeout=3) as r:
            return r.status == 200
    except (OSError, ValueError):
        return False


def wait_answers(url: str, api_key: str, name: str, timeout: float) -> None:
    """One completion of a token through the gateway at `url`, retried until `timeout` (a
    replica just ready may not be routable for a heartbeat): the deployment really serves."""
    deadline = time.monotonic() + timeout
    probe = {"model": name, "prompt": "Hello", "max_tokens": 1}
    while True:
        status, body = _post(f"{url.rstrip('/')}/v1/completions", api_key, probe, timeout=60)
        if status == 200:
            return
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            body = body["error"].get("message")
        if status not in (0, 503) or time.monotonic() > deadline:
            raise ServeError(f"{url}v1/completions did not answer for {name!r} ({status}: {body})")
        time.sleep(0.5)
