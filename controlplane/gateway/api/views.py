from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.gateway import services
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
