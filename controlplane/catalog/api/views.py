from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import status, viewsets
from rest_framework.response import Response

from controlplane.catalog import services
from controlplane.catalog.api.serializers import ModelSerializer
from controlplane.catalog.selectors import model_list
from controlplane.common.schema import ErrorSerializer


@extend_schema_view(
    list=extend_schema(operation_id="models_list"),
    retrieve=extend_schema(operation_id="models_retrieve"),
    create=extend_schema(operation_id="models_create"),
    destroy=extend_schema(
        operation_id="models_destroy",
        responses={204: None, 400: OpenApiResponse(ErrorSerializer, description="a deployment uses the model")},
    ),
)
class ModelViewSet(viewsets.ModelViewSet):
    serializer_class = ModelSerializer
    filterset_fields = ["status", "architecture", "source_type"]
    ordering_fields = ["name", "created_at"]
    http_method_names = ["get", "post", "delete", "head", "options"]

    def get_queryset(self):
        return model_list()

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        model = services.register_model(**serializer.validated_data, actor=request.user)
        return Response(self.get_serializer(model).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        services.delete_model(instance, actor=self.request.user)
