"""The layers stay apart: nothing under workers/ imports the control plane or Django (a GPU
node needs Redis, not database credentials), and the node agent runs without either."""

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("controlplane", "django", "rest_framework", "channels", "celery.contrib.django")


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def test_nothing_under_workers_imports_the_control_plane_or_django():
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in sorted((ROOT / "workers").rglob("*.py"))
        for line, name in _imports(path)
        if name.split(".")[0] in {f.split(".")[0] for f in FORBIDDEN} and name.startswith(FORBIDDEN)
    ]
    assert offenders == []


def test_the_layering_check_sees_a_forbidden_import(tmp_path):
    """The scan above would catch one (guards against a scan that can never fail)."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom controlplane.deployments.models import Replica\nif True:\n    import django\n")
    assert [name for _, name in _imports(bad)] == ["os", "controlplane.deployments.models", "django"]


def test_agent_and_protocol_load_without_django_or_the_database():
    """Importing and configuring the agent, with a database URL that points nowhere, loads
    neither the control plane nor Django's settings or ORM. (kombu imports `django.utils` by
    itself when Django happens to be installed, to serialise its lazy strings: not ours.)"""
    code = (
        "import sys; from workers.agent.config import AgentConfig; import workers.agent.__main__, "
        "workers.agent.node, workers.agent.tasks, workers.protocol.control, workers.protocol.replica, "
        "workers.protocol.model_files; AgentConfig.from_env('n1');"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('controlplane', 'torch')"
        " or m.startswith(('django.conf', 'django.db', 'django.apps'))))"
    )
    env = {**os.environ, "DATABASE_URL": "postgres://nobody@127.0.0.1:1/nothing"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_agent_worker_does_not_load_django_settings_even_when_told_where_they_are():
    """make run sets DJANGO_SETTINGS_MODULE for every process; Celery's Django fixup would then
    load the control plane's settings into the agent when its worker starts."""
    code = (
        "import sys; from unittest import mock; import workers.agent.__main__ as m;"
        "from celery import Celery;"
        "mock.patch.object(Celery, 'worker_main', lambda self, argv: self.loader.init_worker()).start();"
        "mock.patch('workers.agent.node.NodeAgent.start', lambda self: None).start();"
        "m.main(['--node', 'n1']);"
        "print(sorted(m for m in sys.modules if m.startswith(('controlplane', 'django.conf', 'django.db'))))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.config.settings", "REDIS_URL": "redis://127.0.0.1:9/0"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
