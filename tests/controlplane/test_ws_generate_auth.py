"""Who may open /ws/generate/, through the project's whole websocket stack (origin check, session,
API key): applications with a key and no Origin header, the console with its session cookie from
an allowed origin only, and a clear 4401 close with a reason for everyone else."""

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from controlplane.config.asgi import application
from controlplane.gateway.services import create_api_key, revoke_api_key

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

ALLOWED_ORIGIN = (b"origin", b"http://localhost")


@sync_to_async
def api_key(django_user_model, revoked: bool = False) -> str:
    owner = django_user_model.objects.create_user("app-owner")
    key, secret = create_api_key(name="app", owner=owner)
    if revoked:
        revoke_api_key(key)
    return secret


@sync_to_async
def session_cookie(django_user_model) -> tuple[bytes, bytes]:
    browser = Client()
    browser.force_login(django_user_model.objects.create_user("console-user"))
    return (b"cookie", f"sessionid={browser.cookies['sessionid'].value}".encode())


def socket(secret: str | None = None, via: str = "header", headers=()) -> WebsocketCommunicator:
    path, headers = "/ws/generate/", list(headers)
    if secret and via == "query":
        path += f"?api_key={secret}"
    elif secret:
        headers.append((b"authorization", f"Bearer {secret}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)


async def assert_signed_in(comm: WebsocketCommunicator) -> None:
    """Accepted, and requests are answered as a caller's: a model that does not exist is a 404."""
    connected, _ = await comm.connect(timeout=5)
    assert connected
    await comm.send_json_to({"id": "r1", "model": "nope", "messages": [{"role": "user", "content": "hi"}]})
    reply = await comm.receive_json_from(timeout=5)
    assert reply["type"] == "error" and reply["id"] == "r1" and reply["error"]["code"] == "model_not_found"
    await comm.disconnect()


async def assert_closed_4401(comm: WebsocketCommunicator, reason: str) -> None:
    """Accepted, then closed with 4401 and a reason: a real client sees both (a close before the
    accept is only a bare HTTP 403 to it)."""
    connected, _ = await comm.connect(timeout=5)
    assert connected
    close = await comm.receive_output(timeout=5)
    assert close["type"] == "websocket.close" and close["code"] == 4401
    assert reason in close["reason"] and len(close["reason"].encode()) <= 123  # the protocol's limit


@pytest.mark.parametrize("via", ["header", "query"])
async def test_an_api_key_opens_the_socket_without_an_origin_header(django_user_model, via):
    await assert_signed_in(socket(await api_key(django_user_model), via))


@pytest.mark.parametrize("via", ["header", "query"])
async def test_a_revoked_or_unknown_key_is_closed_with_4401_and_a_reason(django_user_model, via):
    await assert_closed_4401(socket(await api_key(django_user_model, revoked=True), via), "Invalid or revoked")
    await assert_closed_4401(socket("sy-not-a-key", via, [ALLOWED_ORIGIN]), "Invalid or revoked")


async def test_no_credentials_is_closed_with_4401_naming_what_to_send():
    await assert_closed_4401(socket(), "API key")


async def test_the_session_cookie_still_needs_an_allowed_origin(django_user_model):
    cookie = await session_cookie(django_user_model)
    for origin in ([], [(b"origin", b"http://evil.example")]):
        refused, _ = await socket(headers=[cookie, *origin]).connect(timeout=5)
        assert not refused
    await assert_signed_in(socket(headers=[cookie, ALLOWED_ORIGIN]))


async def test_a_key_on_the_socket_is_used_instead_of_the_browser_session(django_user_model):
    """A foreign page cannot borrow the visitor's session by adding any api_key to the URL."""
    cookie = await session_cookie(django_user_model)
    evil = (b"origin", b"http://evil.example")
    await assert_closed_4401(socket("sy-attackers-guess", "query", [cookie, evil]), "Invalid or revoked")
