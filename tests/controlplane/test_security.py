"""Secrets and trust boundaries: management tokens kept as hashes, an owner-only state
directory, CSRF on the console's login, model registration confined to MODEL_ROOTS."""

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from rest_framework.test import APIClient

from controlplane.common.models import ManagementToken

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db


# -- management tokens --------------------------------------------------------------------------


def _create_token(capsys, *args) -> str:
    call_command("create_token", *args)
    return capsys.readouterr().out.strip()


def _client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_token_is_stored_as_a_hash_only(staff, capsys):
    secret = _create_token(capsys, "ops", "--name", "ci")
    assert _client(secret).get("/api/v1/models/").status_code == 200
    token = ManagementToken.objects.get(user=staff)
    assert token.hashed_secret == hashlib.sha256(secret.encode()).hexdigest()
    assert secret.startswith(token.prefix) and len(token.prefix) < len(secret) // 2
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {ManagementToken._meta.db_table}")
        rows = cursor.fetchall()
    assert secret not in repr(rows)
    token.refresh_from_db()
    assert token.last_used_at is not None and token.name == "ci"


def test_token_is_shown_once_each_call_makes_a_new_one(staff, capsys):
    first, second = _create_token(capsys, "ops"), _create_token(capsys, "ops")
    assert first != second
    assert ManagementToken.objects.filter(user=staff, revoked_at=None).count() == 2
    assert _client(first).get("/api/v1/models/").status_code == 200
    assert _client(second).get("/api/v1/models/").status_code == 200


def test_revoked_token_is_refused(staff, capsys):
    keep, drop = _create_token(capsys, "ops"), _create_token(capsys, "ops")
    call_command("revoke_tokens", "ops", "--prefix", drop[:12])
    assert "revoked 1 token of ops" in capsys.readouterr().out
    response = _client(drop).get("/api/v1/models/")
    assert response.status_code == 401 and response.json() == {"detail": "Invalid token."}
    assert response["WWW-Authenticate"] == "Bearer"
    assert _client(keep).get("/api/v1/models/").status_code == 200
    call_command("revoke_tokens", "ops")
    assert _client(keep).get("/api/v1/models/").status_code == 401


def test_rotate_revokes_the_users_other_tokens(staff, capsys):
    old = _create_token(capsys, "ops")
    new = _create_token(capsys, "ops", "--rotate")
    assert _client(old).get("/api/v1/models/").status_code == 401
    assert _client(new).get("/api/v1/models/").status_code == 200


def test_right_prefix_wrong_secret_is_refused(staff, capsys):
    secret = _create_token(capsys, "ops")
    forged = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    assert _client(forged).get("/api/v1/models/").status_code == 401


@pytest.mark.parametrize("header", ["Bearer", "Bearer a b", "Bearer syt-", "Bearer 0123456789abcdef0123456789abcdef"])
def test_malformed_bearer_headers_are_401(anon_client, header):
    anon_client.credentials(HTTP_AUTHORIZATION=header)
    response = anon_client.get("/api/v1/models/")
    assert response.status_code == 401 and "detail" in response.json()


def test_token_of_a_deactivated_user_is_refused(staff, capsys):
    secret = _create_token(capsys, "ops")
    staff.is_active = False
    staff.save()
    assert _client(secret).get("/api/v1/models/").status_code == 401


@pytest.mark.django_db(transaction=True)
def test_migration_drops_old_plaintext_tokens():
    """A database from before had DRF's authtoken table, keys in plaintext: the migration drops it."""
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    executor.migrate([("common", "0001_initial")])
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, user_id integer)")
        cursor.execute("INSERT INTO authtoken_token VALUES ('0123456789abcdef0123456789abcdef01234567', 1)")
    executor = MigrationExecutor(connection)
    executor.migrate([("common", "0002_drop_plaintext_tokens")])
    assert "authtoken_token" not in connection.introspection.table_names()


def test_ensure_admin_creates_the_first_admin_once_and_never_resets_it(monkeypatch, capsys):
    """The Kubernetes migrate Job runs it on every deploy: a second run, or one after the admin
    changed the password, changes nothing."""
    from django.contrib.auth import get_user_model
    from django.core.management.base import CommandError

    monkeypatch.delenv("DJANGO_SUPERUSER_USERNAME", raising=False)
    call_command("ensure_admin")
    assert "no admin user created" in capsys.readouterr().out and not get_user_model().objects.exists()
    monkeypatch.setenv("DJANGO_SUPERUSER_USERNAME", "root")
    monkeypatch.delenv("DJANGO_SUPERUSER_PASSWORD", raising=False)
    with pytest.raises(CommandError, match="DJANGO_SUPERUSER_PASSWORD is not set"):
        call_command("ensure_admin")
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "first-password")
    call_command("ensure_admin")
    admin = get_user_model().objects.get(username="root")
    assert admin.is_superuser and admin.is_staff and admin.check_password("first-password")
    admin.set_password("changed-by-the-admin")
    admin.save()
    call_command("ensure_admin")
    assert "exists: left as it is" in capsys.readouterr().out.splitlines()[-1]
    assert get_user_model().objects.get(username="root").check_password("changed-by-the-admin")


# -- state directory ----------------------------------------------------------------------------

STATE_SCRIPT = """
import os, subprocess, sys
from pathlib import Path
import django
django.setup()
from django.conf import settings
from django.db import connection
connection.ensure_connection()  # creates the SQLite file
logs = Path(settings.STATE_DIR) / "logs"
logs.joinpath("web.log").open("ab").close()  # as `make run` opens its processes' logs
subprocess.run([sys.executable, "-c", "open(%r, 'a').close()" % str(logs / "child.log")], check=True)
"""


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _with_open_umask(args: list[str]) -> list[str]:
    """`args` run under a 022 umask, a shell's usual one (this test process already has 077)."""
    return ["sh", "-c", 'umask 022 && exec "$@"', "sh", *args]


def test_state_directory_and_its_files_are_owner_only(tmp_path):
    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True)
    state.chmod(0o755)
    (state / "logs").chmod(0o755)
    (state / "run.json").write_text("{}")  # left by an older version, world-readable
    (state / "run.json").chmod(0o644)
    (state / "logs" / "old.log").write_text("")
    (state / "logs" / "old.log").chmod(0o644)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")}
    env.update(SWITCHYARD_STATE_DIR=str(state), DJANGO_SETTINGS_MODULE="controlplane.config.settings")
    out = subprocess.run(
        _with_open_umask([sys.executable, "-c", STATE_SCRIPT]),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert (_mode(state), _mode(state / "logs")) == (0o700, 0o700)
    files = ["db.sqlite3", "secret_key", "run.json", "logs/old.log", "logs/web.log", "logs/child.log"]
    assert {name: oct(_mode(state / name)) for name in files} == {name: oct(0o600) for name in files}


def test_node_agent_makes_the_state_directory_private(tmp_path, settings):
    """The node agent loads no Django settings: it sets the umask itself (its replicas, which
    write their logs through it, inherit it) and tightens what is there."""
    from tests.support.stack import wait_for
    from workers.bench.processes import stop

    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True)
    state.chmod(0o755)
    (state / "logs" / "replica-9.log").write_text("")
    (state / "logs" / "replica-9.log").chmod(0o644)
    # Without DJANGO_SETTINGS_MODULE, as on a GPU node (with it, Celery's Django fix-up would
    # import the settings, which would do the work).
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(SWITCHYARD_STATE_DIR=str(state), REDIS_URL=settings.REDIS_URL)
    log = (tmp_path / "agent.log").open("wb")
    agent = subprocess.Popen(
        _with_open_umask([sys.executable, "-m", "workers.agent", "--node", "umask-test"]),
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=log,
    )
    try:
        wait_for(lambda: _mode(state / "logs" / "replica-9.log") == 0o600, 60, "the agent to tighten its logs")
        status = Path(f"/proc/{agent.pid}/status").read_text()
        assert "Umask:\t0077" in status
        assert (_mode(state), _mode(state / "logs")) == (0o700, 0o700)
    finally:
        stop([agent], [log])


# -- CSRF on the console's login ----------------------------------------------------------------


def test_login_without_csrf_token_is_refused(staff):
    client = APIClient(enforce_csrf_checks=True)
    response = client.post("/api/v1/auth/login/", {"username": "ops", "password": "pw-ops"}, format="json")
    assert response.status_code == 403 and "CSRF" in response.json()["detail"]
    assert client.get("/api/v1/auth/me/").status_code == 401


def test_login_with_a_wrong_csrf_token_is_refused(staff):
    client = APIClient(enforce_csrf_checks=True)
    client.get("/api/v1/auth/me/")
    response = client.post(
        "/api/v1/auth/login/", {"username": "ops", "password": "pw-ops"}, format="json", HTTP_X_CSRFTOKEN="x" * 32
    )
    assert response.status_code == 403


def test_login_with_the_csrf_cookie_echoed_is_accepted(staff):
    client = APIClient(enforce_csrf_checks=True)
    assert client.get("/api/v1/auth/me/").status_code == 401  # not signed in, but sets the cookie
    csrf = client.cookies["csrftoken"].value
    response = client.post(
        "/api/v1/auth/login/", {"username": "ops", "password": "pw-ops"}, format="json", HTTP_X_CSRFTOKEN=csrf
    )
    assert response.status_code == 200 and response.json()["username"] == "ops"
    assert client.get("/api/v1/auth/me/").json() == {"username": "ops", "is_staff": True}


# -- model roots and files inside the model directory -------------------------------------------


@pytest.fixture
def roots(tmp_path, settings):
    """One model root, tmp_path/models, and nothing else; tmp_path/outside is outside it."""
    (tmp_path / "models").mkdir()
    (tmp_path / "outside").mkdir()
    settings.MODEL_ROOTS = [str(tmp_path / "models")]
    return tmp_path / "models", tmp_path / "outside"


def _register(client, source) -> tuple[int, dict]:
    response = client.post("/api/v1/models/", {"name": "m", "source": str(source)}, format="json")
    return response.status_code, response.json()


def test_model_inside_a_root_registers(staff_client, model_dir, roots):
    inside, _ = roots
    shutil.copytree(model_dir, inside / "tiny")
    status, body = _register(staff_client, inside / "tiny")
    assert status == 201, body


@pytest.mark.parametrize("how", ["outside", "dotdot", "symlink", "relative"])
def test_model_outside_the_roots_is_refused(staff_client, model_dir, roots, how):
    inside, outside = roots
    shutil.copytree(model_dir, outside / "tiny")  # a valid model: only its place is wrong
    (inside / "link").symlink_to(outside / "tiny")
    source = {
        "outside": outside / "tiny",
        "dotdot": f"{inside}/../outside/tiny",
        "symlink": inside / "link",
        "relative": "models/../outside/tiny",
    }[how]
    status, body = _register(staff_client, source)
    assert status == 400, body
    assert list(body) == ["source"]
    assert ("not an absolute path" if how == "relative" else "is not under a model root") in body["source"][0]


def test_outside_the_roots_same_answer_whether_the_path_exists(staff_client, model_dir, roots):
    _, outside = roots
    shutil.copytree(model_dir, outside / "aaaa")
    answers = []
    for name in ("aaaa", "bbbb"):  # exists, does not
        status, body = _register(staff_client, outside / name)
        answers.append((status, body["source"][0].replace(name, "NAME")))
    assert answers[0] == answers[1]


def _sharded_copy(model_dir, target: Path, entry: str) -> Path:
    """model_dir copied to target, with an index whose one shard is named `entry`."""
    shutil.copytree(model_dir, target)
    index = {"metadata": {}, "weight_map": {"w": entry}}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    return target


@pytest.mark.parametrize("entry", ["../secret.safetensors", "a/../../secret.safetensors", "ABSOLUTE"])
def test_weight_map_entries_leaving_the_directory_are_refused(staff_client, model_dir, roots, entry):
    inside, _ = roots
    shutil.copy(model_dir / "model.safetensors", inside / "secret.safetensors")  # a real file to reach
    entry = str(inside / "secret.safetensors") if entry == "ABSOLUTE" else entry
    status, body = _register(staff_client, _sharded_copy(model_dir, inside / "tiny", entry))
    assert status == 400 and "is outside the model directory" in body["source"][0]


def test_shard_symlinked_out_refused_with_the_same_message_whether_it_exists(staff_client, model_dir, roots):
    inside, outside = roots
    shutil.copy(model_dir / "model.safetensors", outside / "real.safetensors")
    answers = []
    for target in ("real.safetensors", "missing.safetensors"):
        model = _sharded_copy(model_dir, inside / "tiny", "shard.safetensors")
        (model / "shard.safetensors").symlink_to(outside / target)
        status, body = _register(staff_client, model)
        answers.append((status, body["source"][0]))
        shutil.rmtree(model)
    assert answers[0] == answers[1]
    assert answers[0][0] == 400 and "'shard.safetensors' is outside the model directory" in answers[0][1]
    assert "real" not in answers[0][1]


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_config_or_tokenizer_symlinked_out_is_refused(staff_client, model_dir, roots, name):
    inside, outside = roots
    model = inside / "tiny"
    shutil.copytree(model_dir, model)
    (model / name).rename(outside / name)
    (model / name).symlink_to(outside / name)
    status, body = _register(staff_client, model)
    assert status == 400 and f"'{name}' is outside the model directory" in body["source"][0]


def test_files_symlinked_out_are_not_counted_on_disk(staff_client, model_dir, roots):
    inside, outside = roots
    model = inside / "tiny"
    shutil.copytree(model_dir, model)
    (outside / "big").write_bytes(b"x" * 1_000_000)
    (model / "notes.txt").symlink_to(outside / "big")
    status, body = _register(staff_client, model)
    assert status == 201
    assert body["bytes_on_disk"] == sum(p.stat().st_size for p in model_dir.iterdir() if p.is_file())


def test_validation_checks_the_roots_again(staff_client, model_dir, roots, settings):
    from controlplane.catalog.models import Model
    from controlplane.catalog.services import validate_model

    inside, _ = roots
    shutil.copytree(model_dir, inside / "tiny")
    status, body = _register(staff_client, inside / "tiny")
    assert status == 201
    settings.MODEL_ROOTS = []
    model = validate_model(body["id"])
    assert model.status == Model.Status.ERROR and "not under a model root" in model.status_message
