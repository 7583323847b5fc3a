"""ASGI entry point: Django for HTTP, Channels for websockets (served by uvicorn)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.config.settings")
get_asgi_application()  # sets Django up; the handlers below are Django's, with the body limit

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402  (needs Django set up first)

from controlplane.common.asgi import LimitedBodyASGIHandler  # noqa: E402
from controlplane.config.routing import websocket_urlpatterns  # noqa: E402
from controlplane.gateway.asgi import GatewayASGIHandler  # noqa: E402
from controlplane.gateway.ws_auth import KeyOrSessionAuth  # noqa: E402

django_asgi = LimitedBodyASGIHandler()
gateway_asgi = GatewayASGIHandler()


async def http(scope, receive, send):
    """/v1/* (the OpenAI API) skips the browser middleware; the rest is the full Django stack."""
    handler = gateway_asgi if scope["path"].startswith("/v1/") else django_asgi
    return await handler(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http,
        # An API key, or the session cookie behind the origin check (see ws_auth).
        "websocket": KeyOrSessionAuth(URLRouter(websocket_urlpatterns)),
    }
)
