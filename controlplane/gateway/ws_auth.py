"""How a websocket connection is authenticated: an API key (applications) or the session
cookie (the console).

The origin check (AllowedHostsOriginValidator) is there because a browser attaches the session
cookie to a websocket that any page opens; an API key is only ever sent by whoever holds it, and
most non-browser clients send no Origin header at all. So a connection that presents a key
(`Authorization: Bearer sy-...` or `?api_key=`) skips the origin check and is never signed in
through the cookie, even if the browser sent one: the key alone decides, in the consumer
(`scope["api_key"]`). Any other connection that carries the session cookie gets the origin check
and the session. A connection with neither reaches its consumer anonymous, to be refused there
with a reason.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.http.cookie import parse_cookie

from controlplane.gateway.generation import secret_from_header


def presented_key(scope) -> str | None:
    """The API key the client sent, if any: `?api_key=` first, then the Authorization header."""
    query = parse_qs(scope.get("query_string", b"").decode("latin1"))
    if query.get("api_key"):
        return query["api_key"][0]
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            return secret_from_header(value.decode("latin1"))
    return None


def _has_session_cookie(scope) -> bool:
    return any(
        name == b"cookie" and settings.SESSION_COOKIE_NAME in parse_cookie(value.decode("latin1"))
        for name, value in scope.get("headers") or ()
    )


class KeyOrSessionAuth:
    """ASGI middleware around the websocket URL router (see the module docstring)."""

    def __init__(self, inner):
        self.inner = inner
        self.session = AllowedHostsOriginValidator(AuthMiddlewareStack(inner))

    async def __call__(self, scope, receive, send):
        key = presented_key(scope)
        if key is None and _has_session_cookie(scope):
            return await self.session(scope, receive, send)
        return await self.inner({**scope, "user": AnonymousUser(), "api_key": key}, receive, send)
