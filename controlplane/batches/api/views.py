from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.batches import services
from controlplane.batches.api.serializers import BatchSerializer
from controlplane.batches.models import Batch, BatchFile
from controlplane.gateway.core import GatewayError

JSONL = OpenApiResponse(description="JSONL: one line per request (OpenAI's batch output lines)")


@extend_schema_view(
    list=extend_schema(operation_id="batches_list"),
    retrieve=extend_schema(operation_id="batches_retrieve"),
)
class BatchViewSet(viewsets.ReadOnlyModelViewSet):
    """Batches (created through /v1/batches with an API key): staff see every one, others their
    own. Staff may cancel one and anyone who sees one may download its output and error files."""

    serializer_class = BatchSerializer
    filterset_fields = ["status"]
    ordering_fields = ["created_at"]

    def get_queryset(self):
        qs = Batch.objects.select_related("owner", "input_file")
        user = self.request.user
        return qs if user.is_staff else qs.filter(owner=user)

    @extend_schema(operation_id="batches_cancel", request=None, responses=BatchSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        try:
            batch = services.cancel_batch(self.get_object())
        except GatewayError as exc:  # not active any more
            return Response({"detail": exc.message}, status=status.HTTP_409_CONFLICT)
        return Response(BatchSerializer(batch).data)

    @extend_schema(operation_id="batches_output", responses={(200, "application/jsonl"): JSONL})
    @action(detail=True, methods=["get"])
    def output(self, request, pk=None):
        return self._download(self.get_object().output_file_id)

    @extend_schema(operation_id="batches_errors", responses={(200, "application/jsonl"): JSONL})
    @action(detail=True, methods=["get"])
    def errors(self, request, pk=None):
        return self._download(self.get_object().error_file_id)

    def _download(self, file_id: str | None) -> HttpResponse:
        f = BatchFile.objects.filter(pk=file_id, deleted=False).first() if file_id else None
        if f is None:
            return Response({"detail": "This batch has no such file (yet)."}, status=status.HTTP_404_NOT_FOUND)
        response = HttpResponse(b"".join(services.file_content(f)), content_type="application/jsonl")
        response["Content-Disposition"] = f'attachment; filename="{f.filename}"'
        return response
