"""The request inspector (controlplane/gateway/inspector.py): a deployment's last requests, newest
first, with their timeline as the replica reported it and their outcome, through the real API."""

from __future__ import annotations

import pytest
import redis
from django.conf import settings

from controlplane.gateway import inspector
from controlplane.gateway.services import create_api_key
from tests.controlplane.test_session_turns import CHAT, serve
from tests.controlplane.test_tracing import answer
from tests.support.played_replica import played_replica
from workers.protocol.replica import ErrorEvent

pytestmark = pytest.mark.django_db


def failing(rid: str, _n: int) -> list:
    return [ErrorEvent(rid, 500, "the engine failed on this request", code="engine_error")]


def test_the_inspector_keeps_each_requests_timeline_and_outcome(client, django_user_model):
    replica = serve()
    rc = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    rc.delete(inspector.key("turns"))
    _, key = create_api_key(name="k", owner=django_user_model.objects.create_user("inspected"))
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    with played_replica(rc, replica, answer=answer):
        ok = client.post("/v1/chat/completions", CHAT, content_type="application/json", **auth)
    with played_replica(rc, replica, answer=failing):
        failed = client.post("/v1/chat/completions", CHAT, content_type="application/json", **auth)
    assert ok.status_code == 200 and failed.status_code == 500
    client.force_login(django_user_model.objects.create_user("viewer"))
    body = client.get("/api/v1/deployments/turns/requests/").json()
    newest, oldest = body["results"]
    assert oldest["id"] == ok.json()["id"] and oldest["status"] == "ok" and oldest["replica"] == replica
    assert (oldest["queue_ms"], oldest["prefill_ms"], oldest["decode_ms"]) == (10.0, 20.0, 0.0)
    assert (oldest["prompt_tokens"], oldest["cached_tokens"], oldest["completion_tokens"]) == (12, 8, 5)
    assert oldest["ttft_ms"] > 0 and oldest["total_ms"] >= oldest["ttft_ms"] and oldest["caller"].startswith("key:")
    assert newest["status"] == "error" and "engine failed" in newest["error"]
    assert client.get("/api/v1/deployments/nowhere/requests/").status_code == 404
