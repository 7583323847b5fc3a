from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import viewsets

from controlplane.events.api.serializers import EventSerializer
from controlplane.events.selectors import event_list


@extend_schema_view(
    list=extend_schema(operation_id="events_list"), retrieve=extend_schema(operation_id="events_retrieve")
)
class EventViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = EventSerializer
    filterset_fields = ["verb", "object_type", "object_id"]
    ordering_fields = ["created_at", "id"]

    def get_queryset(self):
        return event_list()
