from django.db import transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.autoscaling.api.serializers import AutoscalingSerializer
from controlplane.autoscaling.models import Autoscaling
from controlplane.autoscaling.services import validate
from controlplane.deployments.models import Deployment
from controlplane.events.services import record_event


class AutoscalingView(APIView):
    """A deployment's autoscaling: its settings and the current recommendation, and why."""

    def _get(self, slug: str, lock: bool = False) -> Autoscaling:
        deployment = get_object_or_404(Deployment, slug=slug)
        rows = Autoscaling.objects.select_for_update() if lock else Autoscaling.objects
        return rows.filter(deployment=deployment).first() or Autoscaling(deployment=deployment)

    @extend_schema(operation_id="deployments_autoscaling_retrieve", responses=AutoscalingSerializer)
    def get(self, request, slug: str):
        return Response(AutoscalingSerializer(self._get(slug)).data)

    @extend_schema(
        operation_id="deployments_autoscaling_update", request=AutoscalingSerializer, responses=AutoscalingSerializer
    )
    def patch(self, request, slug: str):
        with transaction.atomic():
            auto = self._get(slug, lock=True)  # the autoscaler's step locks it too: neither loses the other's write
            body = AutoscalingSerializer(auto, data=request.data, partial=True)
            body.is_valid(raise_exception=True)
            for key, value in body.validated_data.items():
                setattr(auto, key, value)
            validate(auto)
            if auto.pk is None:
                auto.save()
            else:
                auto.save(update_fields=[*body.validated_data, "updated_at"])
            record_event("autoscaling.updated", auto.deployment, actor=request.user, data=dict(request.data))
        return Response(AutoscalingSerializer(auto).data)
