"""One running platform for a test module: the real processes (tests/support/stack.py), the demo
model, the module's deployments with their replicas ready, and the API keys to call them.

    @pytest.fixture(scope="module")
    def stack(django_db_setup, django_db_blocker, tmp_path_factory):
        with platform(django_db_blocker, tmp_path_factory, "routing", deployments=[...]) as p:
            yield p

What the module sets up differently (its deployments, keys, settings) is arguments, not a copy of
this function."""

from __future__ import annotations

import uuid
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai

from tests.support.stack import (
    committed,
    demo_model,
    processes,
    stack_env,
    start_web,
    wait_online,
    wait_ready,
    wait_web,
)
from workers.bench.processes import free_port, stop

# The demo model served twice: `demo` (one colocated replica) and `demo-pd` (a prefill and a decode replica).
DEMO = {"slug": "demo", "replicas": 1, "max_num_seqs": 16}
DEMO_PD = {"slug": "demo-pd", "mode": "disaggregated", "prefill_replicas": 1, "decode_replicas": 1, "replicas": 0,
           "max_num_seqs": 16}  # fmt: skip


@dataclass
class Platform:
    base: str  # the web process, http://127.0.0.1:<port>
    port: int
    state: Path  # SWITCHYARD_STATE_DIR: the processes' logs under state / "logs"
    node: str
    env: dict  # the processes' environment
    owner: object  # the user who owns the keys
    keys: dict[str, str]  # API key secrets by name, "key" the default
    deployments: dict  # by slug
    replicas: dict[str, list]  # each deployment's replicas as they were once all ready, by slug
    token: str = ""  # a management API token of the owner's, when asked for
    session: str = ""  # a console session cookie of the owner's, when asked for
    model: object = None  # the demo model
    models: dict = field(default_factory=dict)  # every model registered, by name
    procs: list = field(default_factory=list)  # processes()': the control worker, the agent, web (, beat)

    @property
    def key(self) -> str:
        return self.keys["key"]

    def replica(self, slug: str, role: str | None = None):
        """The deployment's one replica (of this role)."""
        [replica] = [r for r in self.replicas[slug] if role is None or r.role == role]
        return replica

    def client(self, key: str = "key") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key=self.keys[key], max_retries=0, timeout=60)

    def http(self, key: str = "key") -> httpx.Client:
        return httpx.Client(base_url=self.base, headers={"Authorization": f"Bearer {self.keys[key]}"}, timeout=60)

    @contextmanager
    def web(self, log_name: str, **env):
        """A second web process on the same database and Redis, with other settings; its base URL."""
        port = free_port()
        proc, log = start_web(self.state, port, {**self.env, **env}, log_name=log_name)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_web(base)
            yield base
        finally:
            stop([proc], [log])


def expected_replicas(spec: dict) -> int:
    return spec.get("replicas", 0) + spec.get("prefill_replicas", 0) + spec.get("decode_replicas", 0)


@contextmanager
def platform(
    django_db_blocker,
    tmp_path_factory,
    label: str,
    *,
    deployments: list[dict],
    keys: dict[str, dict] | None = None,
    env: dict[str, str] | None = None,
    model: str = "demo-model",
    models: dict[str, Path] | None = None,
    staff: bool = False,
    beat: bool = False,
    token: bool = False,
    session: bool = False,
    ready_timeout: float = 120,
):
    """Start the platform (web, control worker, node agent; Celery beat with `beat`) and yield it
    once every deployment's replicas are ready and the web server answers; stop it and flush what
    it committed when the module is done.

    - `deployments`: create_deployment's data; "model" and "draft_model" name a model (the demo
      model, registered as `model`, unless given), its replicas are waited for.
    - `keys`: {name: create_api_key's arguments}, default {"key": {}}; `allowed_deployments` are
      slugs, `owner` another user's name (default the platform's owner).
    - `env`: settings for every process, over stack_env's and REPLICA_CPU_THREADS=1.
    - `models`: more models to register, {name: directory}.
    - `staff`: the owner is staff; `token`, `session`: a management token, a console session.
    - `django_db_blocker` None: the test's own (transactional) database, left as it is."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from controlplane.catalog.services import register_model, validate_model
    from controlplane.common.services import create_token
    from controlplane.deployments.services import create_deployment
    from controlplane.gateway.services import create_api_key

    state = tmp_path_factory.mktemp(label)
    node, port = f"{label}-{uuid.uuid4().hex[:6]}", free_port()
    env = stack_env(state, **{"REPLICA_CPU_THREADS": "1", **(env or {})})
    with committed(django_db_blocker) if django_db_blocker is not None else nullcontext():
        users = get_user_model().objects
        owner = users.create_user(f"{label}-owner", is_staff=staff)
        registered = {model: demo_model(model)}
        for name, source in (models or {}).items():
            registered[name] = validate_model(register_model(name=name, source=str(source)).pk)
            assert registered[name].status == "ready", registered[name].status_message
        with processes(state, node, env, web_port=port, beat=beat) as procs:
            wait_online(node)
            created = {}
            for spec in deployments:
                data = {"model": model, **spec}
                data.update({k: registered[v] for k, v in data.items() if k in ("model", "draft_model")})
                created[spec["slug"]] = create_deployment(data)
            secrets = {}
            for name, options in (keys or {"key": {}}).items():
                options = dict(options)
                user = users.create_user(f"{label}-{options.pop('owner')}") if "owner" in options else owner
                allowed = [created[slug] for slug in options.pop("allowed_deployments", ())]
                secrets[name] = create_api_key(name=name, owner=user, allowed_deployments=allowed, **options)[1]
            management = create_token(owner, name=label)[1] if token else ""
            cookie = ""
            if session:
                browser = Client()
                browser.force_login(owner)  # committed, for the web server to see
                cookie = browser.cookies["sessionid"].value
            replicas = {
                spec["slug"]: wait_ready(spec["slug"], expected_replicas(spec), ready_timeout)
                for spec in deployments
                if expected_replicas(spec)
            }
            base = f"http://127.0.0.1:{port}"
            wait_web(base)
            yield Platform(
                base=base, port=port, state=state, node=node, env=env, owner=owner, keys=secrets,
                deployments=created, replicas=replicas, token=management, session=cookie,
                model=registered[model], models=registered, procs=procs,
            )  # fmt: skip
