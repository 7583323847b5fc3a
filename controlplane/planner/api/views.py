from drf_spectacular.utils import extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.planner import services
from controlplane.planner.api.serializers import PlanRequestSerializer, PlanSerializer


class PlanView(APIView):
    """The capacity plan of a model on a device layout, from its config.json alone. Any signed-in
    user may plan: it changes nothing."""

    permission_classes = [IsAuthenticated]

    @extend_schema(operation_id="plan_create", request=PlanRequestSerializer, responses=PlanSerializer)
    def post(self, request):
        body = PlanRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(PlanSerializer(services.plan(body.validated_data)).data)
