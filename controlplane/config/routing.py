from django.urls import path

from controlplane.events.consumers import EventsConsumer
from controlplane.gateway.consumers import GenerateConsumer

websocket_urlpatterns = [
    path("ws/events/", EventsConsumer.as_asgi()),
    path("ws/generate/", GenerateConsumer.as_asgi()),
]
