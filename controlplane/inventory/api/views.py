from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import viewsets

from controlplane.inventory.api.serializers import DeviceSerializer, NodeSerializer
from controlplane.inventory.selectors import device_list, node_list


@extend_schema_view(
    list=extend_schema(operation_id="nodes_list"), retrieve=extend_schema(operation_id="nodes_retrieve")
)
class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = NodeSerializer
    filterset_fields = ["status", "name"]
    ordering_fields = ["name", "last_heartbeat"]

    def get_queryset(self):
        return node_list()


@extend_schema_view(
    list=extend_schema(operation_id="devices_list"), retrieve=extend_schema(operation_id="devices_retrieve")
)
class DeviceViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = DeviceSerializer
    filterset_fields = ["kind", "health", "node__name"]
    ordering_fields = ["index", "last_seen"]

    def get_queryset(self):
        return device_list()
