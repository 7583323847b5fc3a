from django.conf import settings
from django.http import HttpResponse

from controlplane.common import redis as redis_client
from controlplane.telemetry.prometheus import render


def metrics(request):
    """Prometheus scrape endpoint. With METRICS_TOKEN set, a matching Bearer token is required."""
    token = settings.SWITCHYARD.get("METRICS_TOKEN")
    if token and request.headers.get("Authorization", "") != f"Bearer {token}":
        return HttpResponse(
            "metrics need 'Authorization: Bearer <METRICS_TOKEN>'\n", status=401, content_type="text/plain"
        )
    return HttpResponse(render(redis_client.client()), content_type="text/plain; version=0.0.4; charset=utf-8")
