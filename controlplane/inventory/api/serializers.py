from rest_framework import serializers

from controlplane.inventory.models import Device, Node


class DeviceSerializer(serializers.ModelSerializer):
    node = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = Device
        fields = [
            "id",
            "node",
            "index",
            "kind",
            "name",
            "memory_total",
            "memory_used",
            "utilization",
            "health",
            "last_seen",
        ]


class NodeSerializer(serializers.ModelSerializer):
    devices = DeviceSerializer(many=True, read_only=True)

    class Meta:
        model = Node
        fields = ["id", "name", "queue", "hostname", "labels", "status", "last_heartbeat", "created_at", "devices"]
