"""Each run has its own PostgreSQL and Redis (tests/support/services.py): children of this
pytest process, on ports of their own, gone once the run ends."""

import os
from pathlib import Path

import psycopg
import pytest
import redis
from django.conf import settings
from django.db import connection

from tests.support.services import run_services


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


@pytest.mark.skipif(bool(os.environ.get("TEST_REDIS_URL")), reason="TEST_REDIS_URL names the Redis")
def test_the_redis_is_this_runs_own():
    server = redis.Redis.from_url(settings.REDIS_URL).info("server")
    assert parent_of(server["process_id"]) == os.getpid()


@pytest.mark.skipif(bool(os.environ.get("TEST_DATABASE_URL")), reason="TEST_DATABASE_URL names the database")
@pytest.mark.django_db
def test_the_database_is_this_runs_own():
    with connection.cursor() as cursor:
        cursor.execute("select pg_backend_pid()")
        [[backend]] = cursor.fetchall()
    postmaster = parent_of(backend)  # each connection is a child of the server's first process
    assert parent_of(postmaster) == os.getpid()


def test_a_second_run_gets_other_servers_and_leaves_nothing_behind(monkeypatch):
    monkeypatch.delenv("TEST_DATABASE_URL", raising=False)
    monkeypatch.delenv("TEST_REDIS_URL", raising=False)
    mine = {"DATABASE_URL": os.environ["DATABASE_URL"], "REDIS_URL": os.environ["REDIS_URL"]}
    with run_services() as other:
        assert os.environ["REDIS_URL"] == other["REDIS_URL"] != mine["REDIS_URL"]
        assert other["DATABASE_URL"] != mine["DATABASE_URL"]
        with psycopg.connect(other["DATABASE_URL"].replace("/switchyard", "/postgres"), connect_timeout=5) as db:
            [[pid]] = db.execute("select pg_backend_pid()").fetchall()
            postmaster = parent_of(pid)
        client = redis.Redis.from_url(other["REDIS_URL"])
        server = client.info("server")["process_id"]
        client.close()
    assert {k: os.environ[k] for k in mine} == mine
    for pid in (postmaster, server):
        assert not Path(f"/proc/{pid}").exists() or parent_of(pid) != os.getpid()
