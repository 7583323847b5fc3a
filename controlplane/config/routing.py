from django.urls import path

from controlplane.events.consumers import EventsConsumer
from controlplane.gateway.consumers import GenerateConsumer
from controlplane.telemetry.consumers import MetricsConsumer

websocket_urlpatterns = [
    path("ws/events/", EventsConsumer.as_asgi()),
    path("ws/generate/", GenerateConsumer.as_asgi()),
    path("ws/metrics/", MetricsConsumer.as_asgi()),
]
