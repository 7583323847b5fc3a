"""SQLite is `make run`'s default database: migrations apply and the API works on it."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import django, json
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient
u = get_user_model().objects.create_user("ops", password="x", is_staff=True)
c = APIClient(); c.force_authenticate(u)
r = c.post("/api/v1/cache-policies/", {"name": "default"}, format="json")
assert r.status_code == 201, r.content
print(json.dumps(c.get("/api/v1/cache-policies/").json()["count"]))
"""


def test_migrations_and_api_on_sqlite(tmp_path):
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "SWITCHYARD_STATE_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "controlplane.config.settings",
    }
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "1"
    assert (tmp_path / "db.sqlite3").stat().st_size > 0
