"""What the gateway tells a replica about a request's share of the engine (`share` on the
generate message, scheduler.py): its priority (vLLM's `priority`, OpenAI's `service_tier`), its
tenant (the API key's owner) and that key's weight (management API). Through the real API, to a
replica played by a thread."""

from __future__ import annotations

import pytest
import redis
from django.conf import settings

from controlplane.gateway.services import create_api_key
from tests.controlplane.test_session_turns import CHAT, post, serve
from tests.support.played_replica import played_replica


@pytest.fixture
def redis_client():
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    yield client
    client.close()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "priority"),
    [
        ({}, 0),
        ({"service_tier": "auto"}, 0),
        ({"service_tier": "default"}, 0),
        ({"service_tier": "priority"}, -1),
        ({"service_tier": "flex"}, 1),
        ({"priority": 7}, 7),
        ({"priority": -100, "service_tier": "flex"}, -100),  # the explicit priority wins
    ],
)
def test_priority_and_tenant_reach_the_replica(client, redis_client, django_user_model, body, priority):
    replica = serve()
    owner = django_user_model.objects.create_user("tenant-a")
    _, key = create_api_key(name="k", owner=owner, weight=2.5, min_priority=-100)
    with played_replica(redis_client, replica) as seen:
        post(client, key, {**CHAT, **body})
    [sent] = seen
    assert sent.get("share") == {"priority": priority, "tenant": "tenant-a", "weight": 2.5}, sent


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"service_tier": "scale"}, "service_tier"),
        ({"service_tier": 3}, "service_tier"),
        ({"priority": 101}, "priority"),
        ({"priority": "high"}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"priority": True}, "priority"),
    ],
)
def test_a_bad_priority_is_a_400_naming_it(client, django_user_model, body, param):
    serve()
    _, key = create_api_key(name="k", owner=django_user_model.objects.create_user("tenant-b"))
    response = client.post(
        "/v1/chat/completions", {**CHAT, **body}, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}"
    )
    assert response.status_code == 400, response.content
    assert response.json()["error"]["param"] == param


@pytest.mark.django_db
def test_the_responses_api_takes_a_service_tier(client, redis_client, django_user_model):
    replica = serve()
    _, key = create_api_key(name="k", owner=django_user_model.objects.create_user("tenant-c"))
    body = {"model": "turns", "input": "hi", "max_output_tokens": 1, "service_tier": "flex", "store": False}
    with played_replica(redis_client, replica) as seen:
        response = client.post(
            "/v1/responses", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}"
        )
    assert response.status_code == 200, response.content
    assert response.json()["service_tier"] == "flex"
    [sent] = seen
    assert sent["share"] == {"priority": 1, "tenant": "tenant-c", "weight": 1.0}


@pytest.mark.django_db
def test_a_keys_weight_is_set_and_checked_in_the_management_api(client, django_user_model):
    admin = django_user_model.objects.create_superuser("boss", password="pw")
    client.force_login(admin)
    created = client.post("/api/v1/api-keys/", {"name": "heavy", "weight": 4}, content_type="application/json")
    assert created.status_code == 201, created.content
    assert created.json()["weight"] == 4.0
    pk = created.json()["id"]
    changed = client.patch(f"/api/v1/api-keys/{pk}/", {"weight": 0.5}, content_type="application/json")
    assert changed.status_code == 200 and changed.json()["weight"] == 0.5
    for bad in (0, -1, 5000, "lots"):
        refused = client.patch(f"/api/v1/api-keys/{pk}/", {"weight": bad}, content_type="application/json")
        assert refused.status_code == 400 and "weight" in refused.json(), (bad, refused.content)
    assert client.get(f"/api/v1/api-keys/{pk}/").json()["weight"] == 0.5


@pytest.mark.django_db
@pytest.mark.parametrize(("body", "allowed"), [({"service_tier": "priority"}, False), ({"priority": -3}, False),
                                               ({"priority": 4}, True), ({"service_tier": "flex"}, True)])  # fmt: skip
def test_a_key_may_not_ask_ahead_of_its_min_priority(client, redis_client, django_user_model, body, allowed):
    replica = serve()
    _, key = create_api_key(name="k", owner=django_user_model.objects.create_user("tenant-d"))  # min_priority 0
    with played_replica(redis_client, replica) as seen:
        response = client.post(
            "/v1/chat/completions",
            {**CHAT, **body},
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {key}",
        )
    if allowed:
        assert response.status_code == 200 and len(seen) == 1, response.content
    else:
        assert response.status_code == 403 and not seen
        assert response.json()["error"]["code"] == "priority_not_allowed"
        assert "min_priority" in response.json()["error"]["message"]
