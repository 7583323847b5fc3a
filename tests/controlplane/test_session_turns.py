"""The gateway tells a replica when a request is a turn of a session (`session_turn`, so that the
replica shares its context through the KV store): for each way a client gives a session key —
the policy's header (default `x-session-affinity`), the body's `prompt_cache_key`, the generate
websocket's `session` — and for no other request. Through the real API, to a replica played by a
thread (what it reads is what the gateway sent)."""

from __future__ import annotations

import pytest
import redis
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings

from controlplane.catalog.services import register_model
from controlplane.deployments.models import CachePolicy
from controlplane.deployments.reconciler import reconcile_all
from controlplane.deployments.replica_states import transition_replica
from controlplane.deployments.services import create_deployment
from controlplane.gateway.services import create_api_key
from controlplane.inventory.services import register_node
from tests.support.played_replica import played_replica

CHAT = {"model": "turns", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def serve(header: str | None = None) -> int:
    """A deployment `turns` (with a cache policy naming `header`, if given) and its one replica, ready."""
    register_node(
        name="node-s",
        hostname="node-s",
        devices=[{"index": 0, "kind": "cuda", "name": "H200", "memory_total": 141 << 30}],
    )
    model = register_model(name="tiny", source="org/tiny", source_type="hub")  # the replica tokenises
    policy = CachePolicy.objects.create(name="turns", session_affinity_header=header) if header else None
    deployment = create_deployment({"slug": "turns", "model": model, "replicas": 1, "cache_policy": policy})
    reconcile_all()
    [replica] = deployment.replica_set.all()
    transition_replica(replica.pk, "starting", pid=4242)
    transition_replica(replica.pk, "ready")
    return replica.pk


@pytest.fixture
def redis_client():
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    yield client
    client.close()


def post(client, key: str, body: dict, **headers):
    extra = {f"HTTP_{name.upper().replace('-', '_')}": value for name, value in headers.items()}
    response = client.post(
        "/v1/chat/completions", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}", **extra
    )
    assert response.status_code == 200, response.content
    return response


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("policy_header", "body", "headers", "turn"),
    [
        (None, {}, {"x-session-affinity": "conv-1"}, True),
        ("x-conversation", {}, {"x-conversation": "conv-1"}, True),
        ("x-conversation", {}, {"x-session-affinity": "conv-1"}, False),  # not the header this policy names
        (None, {"prompt_cache_key": "conv-1"}, {}, True),
        (None, {}, {}, False),
        (None, {"user": "someone"}, {}, False),
    ],
)
def test_a_generate_is_a_session_turn_when_the_client_gave_a_session_key(
    client, redis_client, django_user_model, policy_header, body, headers, turn
):
    replica = serve(policy_header)
    _, key = create_api_key(name="turns", owner=django_user_model.objects.create_user("turns-owner"))
    with played_replica(redis_client, replica) as seen:
        post(client, key, {**CHAT, **body}, **headers)
    [sent] = seen
    assert sent.get("session_turn", False) is turn, sent


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_websockets_session_field_makes_a_session_turn(redis_client, django_user_model):
    from controlplane.gateway.consumers import GenerateConsumer

    replica = await sync_to_async(serve)()
    user = await sync_to_async(django_user_model.objects.create_user)("player", password="x")
    comm = WebsocketCommunicator(GenerateConsumer.as_asgi(), "/ws/generate/")
    comm.scope["user"] = user
    assert (await comm.connect(timeout=5))[0]
    with played_replica(redis_client, replica) as seen:
        for rid, extra in (("a", {"session": "conv-1"}), ("b", {})):
            await comm.send_json_to({"id": rid, **CHAT, **extra})
            while (event := await comm.receive_json_from(timeout=10))["type"] != "done":
                assert event["type"] != "error", event
    await comm.disconnect()
    assert [m.get("session_turn", False) for m in seen] == [True, False]
