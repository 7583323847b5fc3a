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
from django.db import connection
with connection.cursor() as cur:
    cur.execute("PRAGMA journal_mode")
    print("journal_mode", cur.fetchone()[0])
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
    lines = out.stdout.strip().splitlines()
    assert lines[-2] == "1"
    # Write-ahead logging: readers and a writer at once, for the several processes sharing the file.
    assert lines[-1] == "journal_mode wal"
    assert (tmp_path / "db.sqlite3").stat().st_size > 0


WRITER = """
import django, sys
django.setup()
from django.db import transaction
from controlplane.inventory.models import Node
for _ in range(int(sys.argv[1])):
    with transaction.atomic():  # read, then write: two such transactions deadlock without IMMEDIATE
        node = Node.objects.get(name="shared")
        Node.objects.filter(pk=node.pk).update(last_report_ns=node.last_report_ns + 1)
"""


def test_concurrent_read_then_write_transactions_never_see_a_locked_database(tmp_path):
    """make run's web, beat and control worker write the same SQLite file: transactions that
    read before they write must wait for each other, not fail with 'database is locked'."""
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "SWITCHYARD_STATE_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "controlplane.config.settings",
    }
    setup = (
        "import django; django.setup(); from django.core.management import call_command;"
        "call_command('migrate', verbosity=0); from controlplane.inventory.models import Node;"
        "Node.objects.create(name='shared', queue='node.shared')"
    )
    subprocess.run([sys.executable, "-c", setup], cwd=ROOT, env=env, check=True, timeout=120)
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, "150"], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    errors = [w.communicate(timeout=180)[1] for w in writers]
    assert [w.returncode for w in writers] == [0, 0, 0], errors
    check = (
        "import django; django.setup(); from controlplane.inventory.models import Node;"
        "print(Node.objects.get(name='shared').last_report_ns)"
    )
    out = subprocess.run([sys.executable, "-c", check], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "450"
