"""Routing quality made visible: the gateway's sums (gateway/routing/quality.py, written here with its own
functions into real Redis) as Prometheus counters per deployment and as each deployment's
`routing_quality` in the API, with the hit rates computed from them."""

import pytest
import redis.asyncio as aioredis
from asgiref.sync import async_to_sync
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from controlplane.catalog.models import Model
from controlplane.common import redis as redis_client
from controlplane.deployments.models import Deployment
from controlplane.gateway.routing import quality
from controlplane.telemetry.prometheus import render
from workers.bench.processes import free_port

pytestmark = pytest.mark.django_db
SLUGS = ("chat", "idle")


@pytest.fixture
def redis():
    client = redis_client.client()
    keys = [quality.quality_key(slug) for slug in SLUGS]
    client.delete(*keys)
    yield client
    client.delete(*keys)


@pytest.fixture
def deployments(db):
    model = Model.objects.create(name="tiny", source="/models/tiny")
    return [Deployment.objects.create(slug=slug, model=model) for slug in SLUGS]


def count(redis):
    """On `chat`: two decisions of 100 prompt tokens (one picked the best prefix), 64 tokens
    reachable and 32 predicted; two finished requests of 100 prompt tokens, 48 of them cached.
    `idle` counted nothing."""
    key = quality.quality_key("chat")
    for name, value in (
        ("decisions", 2),
        ("best_prefix_decisions", 1),
        ("routed_input_tokens", 200),
        ("reachable_tokens", 64),
        ("predicted_tokens", 32),
    ):
        redis.hincrby(key, name, value)

    async def finish(prompt_tokens: int, cached: list[int]) -> None:
        client = aioredis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
        for c in cached:
            await quality.record_usage(client, "chat", {"prompt_tokens": prompt_tokens, "cached_tokens": c})
        await client.aclose()

    async_to_sync(finish)(100, [16, 32])


def test_routing_quality_sums_are_prometheus_counters_per_deployment(redis, deployments):
    count(redis)
    families = {
        f.name: f for f in text_string_to_metric_families(render(redis)) if f.name.startswith("switchyard_routing_")
    }
    samples = {(s.name, s.labels["deployment"]): s.value for f in families.values() for s in f.samples}
    assert {name: value for (name, slug), value in samples.items() if slug == "chat"} == {
        "switchyard_routing_decisions_total": 2,
        "switchyard_routing_best_prefix_decisions_total": 1,
        "switchyard_routing_input_tokens_total": 200,
        "switchyard_routing_reachable_cached_tokens_total": 64,
        "switchyard_routing_predicted_cached_tokens_total": 32,
        "switchyard_routing_served_input_tokens_total": 200,
        "switchyard_routing_cached_tokens_total": 48,
    }
    # A deployment that counted nothing still has its series, at 0 (a counter that appears
    # later would lose its first increase to rate()).
    assert {value for (name, slug), value in samples.items() if slug == "idle"} == {0}
    assert len(samples) == 2 * 7
    assert all(f.type == "counter" and f.documentation for f in families.values())
    text = render(redis)
    assert 'switchyard_routing_cached_tokens_total{deployment="chat"} 48\n' in text
    assert "# TYPE switchyard_routing_decisions_total counter\n" in text


def test_the_api_shows_each_deployments_sums_and_hit_rates(redis, deployments, user_client):
    count(redis)
    chat = user_client.get("/api/v1/deployments/chat/").json()["routing_quality"]
    assert chat == {
        "decisions": 2,
        "best_prefix_decisions": 1,
        "routed_input_tokens": 200,
        "reachable_tokens": 64,
        "predicted_tokens": 32,
        "input_tokens": 200,
        "cached_tokens": 48,
        "achieved_hit_rate": 0.24,
        "reachable_hit_rate": 0.32,
    }
    listed = {d["slug"]: d["routing_quality"] for d in user_client.get("/api/v1/deployments/").json()["results"]}
    assert listed["chat"] == chat
    # Nothing counted: no rate rather than a rate of 0.
    assert listed["idle"]["achieved_hit_rate"] is None and listed["idle"]["reachable_hit_rate"] is None
    assert listed["idle"]["decisions"] == 0


def test_the_deployments_are_still_shown_when_redis_cannot_be_read(deployments, user_client, monkeypatch, settings):
    """Redis really unreachable (a port nobody listens on); the list asks it once, not once per
    deployment (each try could wait out the connect timeout)."""
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    redis_client.client.cache_clear()
    reads = []
    real_read = quality.read
    monkeypatch.setattr(quality, "read", lambda *args: reads.append(args[1]) or real_read(*args))  # a spy
    try:
        response = user_client.get("/api/v1/deployments/chat/")
        assert response.status_code == 200 and response.json()["routing_quality"] is None
        reads.clear()
        listed = user_client.get("/api/v1/deployments/")
        assert listed.status_code == 200
        assert [d["routing_quality"] for d in listed.json()["results"]] == [None, None]
        assert len(reads) == 1
    finally:
        redis_client.client.cache_clear()


def test_the_schema_describes_routing_quality(user_client):
    schema = user_client.get("/api/schema/?format=json").json()
    deployment = schema["components"]["schemas"]["Deployment"]["properties"]["routing_quality"]
    assert deployment.get("readOnly") and deployment.get("nullable")
    fields = schema["components"]["schemas"]["RoutingQuality"]["properties"]
    assert set(fields) == {*quality.FIELDS, "achieved_hit_rate", "reachable_hit_rate"}
