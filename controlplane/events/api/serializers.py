from rest_framework import serializers

from controlplane.events.models import Event


class EventSerializer(serializers.ModelSerializer):
    class Meta:
        model = Event
        fields = ["id", "created_at", "actor_label", "verb", "object_type", "object_id", "object_repr", "data"]
