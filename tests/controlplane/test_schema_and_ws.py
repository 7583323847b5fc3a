"""OpenAPI schema generation/validation and the /ws/events/ websocket."""

import pytest
import yaml
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from openapi_spec_validator import validate

from controlplane.config.asgi import application
from controlplane.events.services import record_event


@pytest.mark.django_db
def test_openapi_schema_generates_and_validates(staff_client):
    response = staff_client.get("/api/schema/")
    assert response.status_code == 200
    spec = yaml.safe_load(response.content)
    validate(spec)
    ops = {op["operationId"] for path in spec["paths"].values() for op in path.values() if "operationId" in op}
    assert {"deployments_start", "deployments_scale", "api_keys_create", "models_create", "nodes_list"} <= ops
    assert "/api/v1/deployments/{slug}/drain/" in spec["paths"]


@pytest.mark.django_db
def test_api_docs_page(staff_client, client, staff):
    client.force_login(staff)
    assert client.get("/api/docs/").status_code == 200


async def signed_in(django_user_model, consumer, path: str, username: str) -> WebsocketCommunicator:
    """A connected socket to `consumer` as the router would reach it: a new user in its scope."""
    user = await sync_to_async(django_user_model.objects.create_user)(username, password="x")
    comm = WebsocketCommunicator(consumer.as_asgi(), path)
    comm.scope["user"] = user
    connected, _ = await comm.connect(timeout=5)
    assert connected
    return comm


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_events_websocket_streams_state_changes(django_user_model):
    from controlplane.events.consumers import EventsConsumer

    comm = await signed_in(django_user_model, EventsConsumer, "/ws/events/", "watcher")
    hello = await comm.receive_json_from(timeout=5)
    assert hello == {"kind": "hello", "data": {"user": "watcher"}}
    await sync_to_async(record_event)(
        "deployment.created", None, actor_label="test", object_type="deployment", object_id="demo"
    )
    message = await comm.receive_json_from(timeout=5)
    assert message["kind"] == "event" and message["data"]["verb"] == "deployment.created"
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_events_websocket_refuses_anonymous():
    comm = WebsocketCommunicator(application, "/ws/events/", headers=[(b"origin", b"http://localhost")])
    connected, code = await comm.connect(timeout=5)
    assert not connected and code == 4401


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_metrics_websocket_forwards_each_sample(django_user_model):
    from channels.layers import get_channel_layer

    from controlplane.telemetry.consumers import MetricsConsumer
    from controlplane.telemetry.history import GROUP

    comm = await signed_in(django_user_model, MetricsConsumer, "/ws/metrics/", "charts")
    points = {"demo": {"t": 1.0, "tokens_per_second": 12.5}}
    await get_channel_layer().group_send(GROUP, {"type": "metrics.points", "points": points})
    assert await comm.receive_json_from(timeout=5) == {"kind": "metrics", "points": points}
    await comm.disconnect()
    anon = WebsocketCommunicator(application, "/ws/metrics/", headers=[(b"origin", b"http://localhost")])
    connected, code = await anon.connect(timeout=5)
    assert not connected and code == 4401
