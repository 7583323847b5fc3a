from rest_framework import serializers

from controlplane.catalog.models import Model


class ModelSerializer(serializers.ModelSerializer):
    class Meta:
        model = Model
        fields = [
            "id",
            "name",
            "source_type",
            "source",
            "architecture",
            "parameter_count",
            "dtype",
            "bytes_on_disk",
            "checksum",
            "context_length",
            "status",
            "status_message",
            "created_at",
            "updated_at",
        ]
        read_only_fields = [f for f in fields if f not in ("name", "source_type", "source")]
