"""Django's ASGI handler with the request body limit enforced while the body arrives.

Django's own handler reads a whole body into a temporary file (to disk past 2.5 MB) before
any check, so a client could make the server store gigabytes only to be refused. This one
answers 413 as soon as the declared length or the bytes received pass MAX_REQUEST_BYTES, and
Django never sees the request. Views keep Django's own check too (request.body raises
RequestDataTooBig) for clients that bypass ASGI (the test client, WSGI).
"""

from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpResponse, JsonResponse

from controlplane.common.json_body import too_large


class _BodyTooLarge(Exception):
    pass


class LimitedBodyASGIHandler(ASGIHandler):
    def too_large_response(self, size: int | None, scope) -> HttpResponse:
        """The 413, in the management API's error shape (the OpenAI gateway overrides it)."""
        return JsonResponse({"detail": too_large(size).message}, status=413)

    def body_limit(self, scope) -> int:
        """MAX_REQUEST_BYTES; a Batch API file upload may be up to MAX_UPLOAD_BYTES."""
        if scope.get("path") == "/v1/files" and scope.get("method") == "POST":
            return settings.MAX_UPLOAD_BYTES
        return settings.MAX_REQUEST_BYTES

    async def handle(self, scope, receive, send):
        limit = self.body_limit(scope)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self.send_response(self.too_large_response(declared, scope), send)
            return
        received = 0

        async def bounded_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise _BodyTooLarge
            return message

        try:
            await super().handle(scope, bounded_receive, send)
        except _BodyTooLarge:  # raised while Django reads the body, before it made a request of it
            await self.send_response(self.too_large_response(None, scope), send)


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # Django answers a malformed header itself
    return None
