from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.deployments import services
from controlplane.deployments.api.serializers import (
    CachePolicySerializer,
    DeploymentSerializer,
    DrainSerializer,
    ReplicaSerializer,
    ScaleSerializer,
)
from controlplane.deployments.selectors import cache_policy_list, deployment_list, replica_list
from controlplane.events.services import record_event


def _ops(prefix: str, extra: tuple[str, ...] = ()) -> dict:
    names = ("list", "retrieve", "create", "update", "partial_update", "destroy", *extra)
    return {n: extend_schema(operation_id=f"{prefix}_{n}") for n in names}


@extend_schema_view(**_ops("deployments"))
class DeploymentViewSet(viewsets.ModelViewSet):
    serializer_class = DeploymentSerializer
    lookup_field = "slug"
    filterset_fields = ["mode", "desired_state", "model__name"]
    ordering_fields = ["slug", "created_at"]

    def get_queryset(self):
        return deployment_list().prefetch_related("replica_set")

    def perform_create(self, serializer):
        serializer.instance = services.create_deployment(serializer.validated_data, actor=self.request.user)

    def perform_update(self, serializer):
        serializer.instance = services.update_deployment(
            serializer.instance, serializer.validated_data, actor=self.request.user
        )

    def perform_destroy(self, instance):
        services.stop(instance, actor=self.request.user)
        record_event("deployment.deleted", instance, actor=self.request.user)
        instance.delete()

    def _respond(self, dep):
        return Response(DeploymentSerializer(deployment_list().get(pk=dep.pk)).data)

    @extend_schema(operation_id="deployments_start", request=None, responses=DeploymentSerializer)
    @action(detail=True, methods=["post"])
    def start(self, request, slug=None):
        return self._respond(services.start(self.get_object(), actor=request.user))

    @extend_schema(operation_id="deployments_stop", request=None, responses=DeploymentSerializer)
    @action(detail=True, methods=["post"])
    def stop(self, request, slug=None):
        return self._respond(services.stop(self.get_object(), actor=request.user))

    @extend_schema(operation_id="deployments_restart", request=None, responses=DeploymentSerializer)
    @action(detail=True, methods=["post"])
    def restart(self, request, slug=None):
        return self._respond(services.restart(self.get_object(), actor=request.user))

    @extend_schema(operation_id="deployments_scale", request=ScaleSerializer, responses=DeploymentSerializer)
    @action(detail=True, methods=["post"])
    def scale(self, request, slug=None):
        body = ScaleSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return self._respond(services.update_deployment(self.get_object(), body.validated_data, actor=request.user))

    @extend_schema(operation_id="deployments_drain", request=DrainSerializer, responses=ReplicaSerializer(many=True))
    # The replicas it drained, all of them: neither filtered nor paginated like the list.
    @action(detail=True, methods=["post"], filter_backends=[], pagination_class=None)
    def drain(self, request, slug=None):
        body = DrainSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        drained = services.drain(self.get_object(), body.validated_data.get("replica"), actor=request.user)
        return Response(ReplicaSerializer(drained, many=True).data)


@extend_schema_view(**_ops("cache_policies"))
class CachePolicyViewSet(viewsets.ModelViewSet):
    serializer_class = CachePolicySerializer
    filterset_fields = ["name", "prefix_caching"]
    ordering_fields = ["name", "created_at"]

    def get_queryset(self):
        return cache_policy_list()

    def perform_create(self, serializer):
        from controlplane.deployments.models import CachePolicy

        serializer.instance = services.save_cache_policy(
            CachePolicy(**serializer.validated_data), actor=self.request.user, created=True
        )

    def perform_update(self, serializer):
        policy = serializer.instance
        for key, value in serializer.validated_data.items():
            setattr(policy, key, value)
        serializer.instance = services.save_cache_policy(policy, actor=self.request.user)


@extend_schema_view(
    list=extend_schema(operation_id="replicas_list"), retrieve=extend_schema(operation_id="replicas_retrieve")
)
class ReplicaViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = ReplicaSerializer
    filterset_fields = ["deployment__slug", "state", "role", "node__name"]
    ordering_fields = ["id", "created_at"]

    def get_queryset(self):
        return replica_list()
