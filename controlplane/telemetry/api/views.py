from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.common import redis as redis_client
from controlplane.common.schema import ErrorSerializer
from controlplane.deployments.models import Deployment
from controlplane.telemetry.history import HISTORY_SECONDS, history


class MetricsHistoryView(APIView):
    """The last `seconds` (up to 900) of one deployment's 1-second metric points."""

    permission_classes = [IsAuthenticated]

    @extend_schema(
        operation_id="telemetry_history",
        parameters=[
            OpenApiParameter("deployment", str, required=True),
            OpenApiParameter("seconds", int, required=False, description=f"at most {HISTORY_SECONDS}"),
        ],
        responses={
            200: inline_serializer(
                "MetricsHistory",
                {
                    "deployment": serializers.CharField(),
                    "points": serializers.ListField(child=serializers.DictField(), help_text="oldest first"),
                },
            ),
            404: ErrorSerializer,  # no such deployment (a 400 without one: common.schema adds it)
        },
    )
    def get(self, request):
        slug = request.query_params.get("deployment")
        if not slug:
            raise ValidationError({"deployment": "name a deployment: ?deployment=<slug>"})
        if not Deployment.objects.filter(slug=slug).exists():
            raise NotFound(f"no deployment named {slug!r}")
        try:
            seconds = min(int(request.query_params.get("seconds", HISTORY_SECONDS)), HISTORY_SECONDS)
        except ValueError:
            raise ValidationError({"seconds": "an integer number of seconds"}) from None
        return Response({"deployment": slug, "points": history(redis_client.client(), slug, seconds)})
