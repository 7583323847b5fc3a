from django.db import connection
from django.http import JsonResponse

from controlplane.common import redis as redis_client


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
