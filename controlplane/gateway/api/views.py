from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.common import redis as redis_client
from controlplane.deployments.models import Deployment
from controlplane.gateway import inspector, services
from controlplane.gateway.api.serializers import ApiKeyCreatedSerializer, ApiKeySerializer
from controlplane.gateway.selectors import api_keys_visible_to


@extend_schema_view(
    list=extend_schema(operation_id="api_keys_list"),
    retrieve=extend_schema(operation_id="api_keys_retrieve"),
    update=extend_schema(operation_id="api_keys_update"),
    partial_update=extend_schema(operation_id="api_keys_partial_update"),
    destroy=extend_schema(operation_id="api_keys_destroy", description="Revokes the key (kept for the audit log)."),
)
class ApiKeyViewSet(viewsets.ModelViewSet):
    serializer_class = ApiKeySerializer
    filterset_fields = ["revoked"]
    ordering_fields = ["created_at", "name"]

    def get_queryset(self):
        return api_keys_visible_to(self.request.user)

    @extend_schema(operation_id="api_keys_create", responses={201: ApiKeyCreatedSerializer})
    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        key, secret = services.create_api_key(owner=request.user, actor=request.user, **serializer.validated_data)
        data = ApiKeyCreatedSerializer(key).data
        data["secret"] = secret
        return Response(data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        services.revoke_api_key(instance, actor=self.request.user)

    @extend_schema(operation_id="api_keys_revoke", request=None, responses=ApiKeySerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        return Response(ApiKeySerializer(services.revoke_api_key(self.get_object(), actor=request.user)).data)


class RecentRequestsView(APIView):
    """The request inspector: a deployment's last requests with their timelines (inspector.py)."""

    @extend_schema(operation_id="deployments_recent_requests", responses={200: dict})
    def get(self, request, slug: str):
        if not Deployment.objects.filter(slug=slug).exists():
            raise NotFound(f"No deployment '{slug}'.")
        return Response({"deployment": slug, "results": inspector.recent(redis_client.client(), slug)})
