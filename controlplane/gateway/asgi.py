"""A Django ASGI handler without middleware, for the OpenAI API under /v1/.

The browser-facing middleware (sessions, CSRF, messages, auth...) is synchronous: under ASGI
each one costs two thread hops per request, about 5 ms in all on a small machine, and the
API authenticates with its own keys and needs none of it. Everything else is ordinary Django
(URL routing, views, signals, exception handling), and the body limit of every handler
(common.asgi), answered in OpenAI's error shape (Anthropic's on /v1/messages).
"""

from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpResponse, JsonResponse

from controlplane.common.asgi import LimitedBodyASGIHandler
from controlplane.gateway.core import too_large
from controlplane.gateway.dialects.anthropic.request import ANTHROPIC_PATHS, error_body


class GatewayASGIHandler(LimitedBodyASGIHandler):
    def too_large_response(self, size: int | None, scope) -> HttpResponse:
        exc = too_large(size)
        return JsonResponse(error_body(exc) if scope["path"] in ANTHROPIC_PATHS else exc.body(), status=exc.status)

    def load_middleware(self, is_async=False):
        self._view_middleware = []
        self._template_response_middleware = []
        self._exception_middleware = []
        get_response = self._get_response_async if is_async else self._get_response
        self._middleware_chain = convert_exception_to_response(get_response)
