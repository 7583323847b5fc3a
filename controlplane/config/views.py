"""The web server's own top-level paths: health, version, static files, and the JSON answers for
what no view handles (unknown paths, methods a page does not take, CSRF failures).

Errors are JSON everywhere but the admin (an HTML app): DRF's shape (`{"detail": ...}`) under
/api/, the management API; OpenAI's shape (`{"error": {...}}`) elsewhere, where OpenAI and vLLM
clients call (/v1/*, /health, /version, /tokenize...).
"""

import tomllib
from functools import wraps
from pathlib import Path

from django.conf import settings
from django.contrib.staticfiles.views import serve as serve_static
from django.db import connection
from django.http import Http404, HttpResponse, JsonResponse
from django.views.csrf import csrf_failure as html_csrf_failure
from django.views.decorators.csrf import csrf_exempt

from controlplane.common import redis as redis_client
from controlplane.gateway.core.errors import OpenAIError

VERSION = tomllib.loads((Path(settings.BASE_DIR) / "pyproject.toml").read_text())["project"]["version"]
SAFE_METHODS = ("GET", "HEAD")


def json_error(request, status: int, message: str, code: str) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": message}, status=status)
    return JsonResponse(OpenAIError(status, message, code=code).body(), status=status)


def read_only(view):
    """GET and HEAD only; any other method is a JSON 405. Nothing such a view does needs CSRF, and
    without the exemption a POST would get Django's HTML CSRF page instead."""

    @csrf_exempt
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.method not in SAFE_METHODS:
            response = json_error(
                request, 405, f"Method {request.method} is not allowed on {request.path}.", "method_not_allowed"
            )
            response["Allow"] = ", ".join(SAFE_METHODS)
            return response
        return view(request, *args, **kwargs)

    return wrapper


@read_only
def healthz(request):
    """DB and Redis reachability; 503 when either is down (for load balancers and `make run`)."""
    checks = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # any driver error means "down" here
        checks["database"] = f"error: {exc}"
    try:
        redis_client.client().ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"error: {exc}"
    healthy = all(v == "ok" for v in checks.values())
    return JsonResponse({"status": "ok" if healthy else "degraded", **checks}, status=200 if healthy else 503)


@read_only
def version(request):
    return JsonResponse({"version": VERSION})


@read_only
def static(request, path: str):
    """/static/: the installed apps' static files (the admin's, the API docs' Swagger UI), found
    where the apps keep them, so that no collectstatic step or second server is needed. Django
    calls this "insecure" for its runserver; the finders only look inside the apps' static
    directories, and a path that climbs out of them is refused here first."""
    if ".." in path.split("/") or "\\" in path:
        raise Http404
    return serve_static(request, path, insecure=True)


def not_found(request, exception=None):
    """handler404: a path nothing serves (with DEBUG on, Django shows its debug page instead)."""
    return json_error(request, 404, f"Unknown endpoint {request.method} {request.path}.", "unknown_url")


def csrf_failure(request, reason: str = ""):
    """CSRF_FAILURE_VIEW: JSON like the rest of the API; the admin keeps Django's HTML page."""
    if request.path.startswith("/admin/"):
        return html_csrf_failure(request, reason)
    return json_error(request, 403, f"CSRF Failed: {reason}", "csrf_failed")
