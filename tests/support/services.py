"""The test run's own PostgreSQL and Redis: started on free ports in a temporary directory for
one pytest session and stopped with it, so two runs never share a database or flush each
other's Redis, and a machine needs neither service running (only installed: `make setup`).

Loaded as a pytest plugin (pyproject.toml's addopts), it starts them before Django reads its
settings. `TEST_DATABASE_URL` / `TEST_REDIS_URL` in the environment use that service instead of
starting one. Each server dies with the pytest process even when that is killed (the kernel sends it a
signal when its parent exits), so an interrupted run leaves no server behind."""

from __future__ import annotations

import ctypes
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from workers.bench.processes import environ
from workers.kvtiers.master import free_port

_PR_SET_PDEATHSIG = 1
START_TIMEOUT = 60.0  # initdb and a first start on a loaded 2-core machine take seconds, not this
ATTEMPTS = 3  # another process may take the free port before the server binds it


def _dies_with_parent(sig: signal.Signals):
    def preexec() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))

    return preexec


def _wait_until(ready, proc: subprocess.Popen, log: Path, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not ready():
        if proc.poll() is not None:
            raise ServiceError(f"{what} exited with {proc.returncode}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise ServiceError(f"{what} did not answer within {START_TIMEOUT:g} s:\n{_tail(log)}")
        time.sleep(0.05)


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen, sig: signal.Signals) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class ServiceError(RuntimeError):
    pass


def postgres_bin() -> Path:
    """The newest installed PostgreSQL's server binaries (Debian keeps them off PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if not found:
        raise ServiceError(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): run `make setup`, "
            "or point TEST_DATABASE_URL at a PostgreSQL server"
        )
    return Path(found[-1]).parent


@contextmanager
def postgres(root: Path):
    """A PostgreSQL cluster of its own under `root`, on a free port; yields its URL (database
    `switchyard`: pytest-django creates `test_switchyard` beside it). PostgreSQL refuses to run as
    root, so as root the cluster belongs to the `postgres` system user."""
    bindir = postgres_bin()
    owner = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
    as_owner = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []} if owner else {}
    data, log = root / "data", root / "postgres.log"
    if owner:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    subprocess.run(
        [bindir / "initdb", "-D", data, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C",
         "--no-sync", "--no-instructions"],
        check=True, capture_output=True, timeout=START_TIMEOUT, **as_owner,
    )  # fmt: skip
    for _ in range(ATTEMPTS):
        port = free_port()
        with open(log, "ab") as logf:
            # Durability off: the cluster is thrown away with the run.
            proc = subprocess.Popen(
                [bindir / "postgres", "-D", data, "-p", str(port), "-h", "127.0.0.1", "-k", root,
                 "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                 "-c", "max_connections=300"],
                stdout=logf, stderr=subprocess.STDOUT, preexec_fn=_dies_with_parent(signal.SIGQUIT), **as_owner,
            )  # fmt: skip

        def ready(port=port) -> bool:
            probe = [bindir / "pg_isready", "-q", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres"]
            return subprocess.run(probe, timeout=10).returncode == 0

        try:
            _wait_until(ready, proc, log, f"PostgreSQL on port {port}")
        except ServiceError:
            _stop(proc, signal.SIGQUIT)
            if "Address already in use" in _tail(log):
                continue
            raise
        try:
            yield f"postgres://postgres@127.0.0.1:{port}/switchyard"
        finally:
            _stop(proc, signal.SIGINT)  # fast shutdown: disconnects the clients left
        return
    raise ServiceError(f"PostgreSQL found no free port in {ATTEMPTS} tries:\n{_tail(log)}")


@contextmanager
def redis_server(root: Path):
    """A redis-server of its own on a free port, persisting nothing; yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ServiceError("redis-server is not installed: run `make setup`, or point TEST_REDIS_URL at a Redis")
    import redis

    log = root / "redis.log"
    for _ in range(ATTEMPTS):
        port = free_port()
        with open(log, "ab") as logf:
            proc = subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(root)],
                stdout=logf, stderr=subprocess.STDOUT, preexec_fn=_dies_with_parent(signal.SIGTERM),
            )  # fmt: skip
        client = redis.Redis(port=port, socket_connect_timeout=1)

        def ready(client=client) -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        try:
            _wait_until(ready, proc, log, f"redis-server on port {port}")
        except ServiceError:
            _stop(proc, signal.SIGTERM)
            if "Address already in use" in _tail(log):
                continue
            raise
        finally:
            client.close()
        try:
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            _stop(proc, signal.SIGTERM)
        return
    raise ServiceError(f"redis-server found no free port in {ATTEMPTS} tries:\n{_tail(log)}")


@contextmanager
def run_services():
    """DATABASE_URL and REDIS_URL in os.environ pointed at this run's services (the caller's
    TEST_DATABASE_URL / TEST_REDIS_URL, or private ones) until the block ends; yields the URLs.
    Django reads them when its settings are first imported, and the processes the tests start
    inherit them."""
    with ExitStack() as stack:
        root = Path(tempfile.mkdtemp(prefix="switchyard-test-services-"))
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        database = os.environ.get("TEST_DATABASE_URL") or stack.enter_context(postgres(root))
        broker = os.environ.get("TEST_REDIS_URL") or stack.enter_context(redis_server(root))
        with environ(DATABASE_URL=database, REDIS_URL=broker):
            yield {"DATABASE_URL": database, "REDIS_URL": broker}


# -- as a pytest plugin (`-p tests.support.services` in pyproject.toml's addopts) ---------------
# Django reads its settings when pytest-django sets it up, in its pytest_load_initial_conftests,
# before any conftest is imported; a wrapper of that hook runs before it.
_session = pytest.StashKey[ExitStack]()


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    if early_config.known_args_namespace.help or early_config.known_args_namespace.version:
        return (yield)
    stack = early_config.stash[_session] = ExitStack()
    stack.enter_context(run_services())
    try:
        return (yield)
    except BaseException:  # pytest will not unconfigure what failed to configure
        _close(early_config)
        raise


def pytest_unconfigure(config):
    _close(config)


def _close(config) -> None:
    if _session in config.stash:
        stack = config.stash[_session]
        del config.stash[_session]
        stack.close()
