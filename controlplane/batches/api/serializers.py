from rest_framework import serializers

from controlplane.batches.models import Batch


class BatchSerializer(serializers.ModelSerializer):
    """A batch as the console shows it (the OpenAI shape is /v1/batches')."""

    owner = serializers.SlugRelatedField(slug_field="username", read_only=True)
    input_filename = serializers.CharField(source="input_file.filename", read_only=True, default=None, allow_null=True)
    request_counts = serializers.SerializerMethodField()

    class Meta:
        model = Batch
        fields = [
            "id", "owner", "endpoint", "model", "status", "errors", "input_file_id", "input_filename",
            "output_file_id", "error_file_id", "request_counts", "metadata", "created_at", "expires_at",
            "in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
            "cancelled_at",
        ]  # fmt: skip
        read_only_fields = fields

    def get_request_counts(self, batch: Batch) -> dict:
        return {"total": batch.total, "completed": batch.completed, "failed": batch.failed}
