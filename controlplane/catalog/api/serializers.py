from rest_framework import serializers

from controlplane.catalog.models import Model


class ModelSerializer(serializers.ModelSerializer):
    is_draft = serializers.BooleanField(
        read_only=True, help_text="an EAGLE-3 draft head: a deployment's draft_model, not served on its own"
    )

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
            "is_draft",
            "created_at",
            "updated_at",
        ]
        read_only_fields = [f for f in fields if f not in ("name", "source_type", "source")]
