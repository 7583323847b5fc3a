"""Usage per tenant (controlplane/usage): two tenants' requests through the real API, counted by
the gateway, flushed into hourly rows: the totals equal the sums of the `usage` each response
carried, by owner, key, deployment and hour, as JSON and as CSV; a flush retried adds nothing."""

from __future__ import annotations

import csv
import io

import pytest
import redis
from django.conf import settings

from controlplane.common import redis as redis_client
from controlplane.gateway.services import create_api_key
from controlplane.usage import services
from controlplane.usage.models import UsageHour
from tests.controlplane.test_session_turns import CHAT, serve
from tests.support.played_replica import played_replica
from workers.protocol.replica import DeltaEvent

pytestmark = pytest.mark.django_db


def answer(rid: str, _n: int) -> list:
    """Each choice of the request ends with its own usage (the played replica's answer)."""
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "cached_tokens": 2}
    return [DeltaEvent(rid, "ok", [7, 8, 9], finish_reason="length", usage=usage, index=i) for i in range(2)]


@pytest.fixture
def rc():
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    for key in client.scan_iter(match=f"{services.PREFIX}*"):
        client.delete(key)
    yield client
    client.close()


def ask(client, key: str, n: int) -> dict:
    response = client.post(
        "/v1/chat/completions", {**CHAT, "n": n}, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}"
    )
    assert response.status_code == 200, response.content
    return response.json()["usage"]


def test_usage_totals_equal_the_sum_of_the_responses_usage(client, rc, django_user_model):
    replica = serve()
    alice, bob = (django_user_model.objects.create_user(name) for name in ("alice", "bob"))
    keys = {"alice": create_api_key(name="a", owner=alice)[1], "bob": create_api_key(name="b", owner=bob)[1]}
    sums = {name: {"requests": 0, "input_tokens": 0, "cached_tokens": 0, "output_tokens": 0} for name in keys}
    with played_replica(rc, replica, answer=answer):
        for name, n, times in (("alice", 2, 3), ("bob", 2, 2)):
            for _ in range(times):
                usage = ask(client, keys[name], n)
                sums[name]["requests"] += 1
                sums[name]["input_tokens"] += usage["prompt_tokens"]
                sums[name]["cached_tokens"] += usage["prompt_tokens_details"]["cached_tokens"]
                sums[name]["output_tokens"] += usage["completion_tokens"]
    assert sums["alice"] == {"requests": 3, "input_tokens": 21, "cached_tokens": 6, "output_tokens": 18}
    assert services.flush(redis_client.client()) == 2  # one row per tenant this hour

    staff = django_user_model.objects.create_superuser("ops", password="pw")
    client.force_login(staff)
    by_owner = client.get("/api/v1/usage/", {"group_by": "owner"}).json()["results"]
    assert {row.pop("owner"): row for row in by_owner} == sums
    by_key = client.get("/api/v1/usage/", {"group_by": "api_key"}).json()["results"]
    assert [(row["owner"], row["api_key"], row["requests"]) for row in by_key] == [("alice", "a", 3), ("bob", "b", 2)]
    [by_deployment] = client.get("/api/v1/usage/", {"group_by": "deployment"}).json()["results"]
    assert by_deployment["deployment"] == "turns" and by_deployment["output_tokens"] == 30
    [by_hour] = client.get("/api/v1/usage/", {"group_by": "hour"}).json()["results"]
    assert by_hour["requests"] == 5
    exported = client.get("/api/v1/usage/", {"group_by": "owner", "export": "csv"})
    assert exported["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(exported.content.decode())))
    assert {row["owner"]: int(row["output_tokens"]) for row in rows} == {"alice": 18, "bob": 12}

    client.force_login(alice)  # not staff: their own only
    assert [row["owner"] for row in client.get("/api/v1/usage/").json()["results"]] == ["alice"]


def test_a_flush_retried_after_a_crash_adds_nothing_twice(rc, django_user_model):
    owner = django_user_model.objects.create_user("carol")
    sync = redis_client.client()
    key = f"{services.FLUSHING}2026120712:crashed"
    sync.hset(key, mapping={f"{owner.pk}|0|chat|requests": 2, f"{owner.pk}|0|chat|output_tokens": 9})
    assert services._apply(sync, key) == 1
    sync.hset(key, mapping={f"{owner.pk}|0|chat|requests": 2, f"{owner.pk}|0|chat|output_tokens": 9})  # not deleted
    services.flush(sync)  # the retry finds the hash again: already applied, only deleted now
    row = UsageHour.objects.get(owner=owner)
    assert (row.requests, row.output_tokens, row.api_key_id) == (2, 9, None)
    assert not list(sync.scan_iter(match=f"{services.PREFIX}*"))


@pytest.mark.parametrize(("params", "field"), [({"group_by": "planet"}, "group_by"), ({"from": "yesterday"}, "from")])
def test_a_bad_query_is_a_400_naming_it(client, django_user_model, params, field):
    client.force_login(django_user_model.objects.create_superuser("ops2", password="pw"))
    response = client.get("/api/v1/usage/", params)
    assert response.status_code == 400 and field in response.json()
