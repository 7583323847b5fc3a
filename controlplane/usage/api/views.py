from datetime import datetime, timedelta

from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.usage.models import UsageHour
from controlplane.usage.services import GROUPS, as_csv, report


def _when(request, name: str, default: datetime) -> datetime:
    raw = request.query_params.get(name)
    if not raw:
        return default
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise ValidationError({name: f"'{raw[:40]}' is not an ISO 8601 date or time."}) from None
    return value if value.tzinfo else value.replace(tzinfo=timezone.get_current_timezone())


class UsageView(APIView):
    """Tokens and requests per tenant: staff see everyone's, others their own."""

    @extend_schema(
        operation_id="usage_report",
        parameters=[
            OpenApiParameter("from", str, description="ISO 8601; default: 24 hours ago"),
            OpenApiParameter("to", str, description="ISO 8601; default: now"),
            OpenApiParameter("group_by", str, enum=list(GROUPS), description="default: owner"),
            OpenApiParameter("export", str, enum=["csv"], description="csv: the results as a CSV file"),
        ],
        responses={
            (200, "application/json"): dict,
            (200, "text/csv"): OpenApiResponse(
                response=OpenApiTypes.STR, description="with export=csv: the results, a header row first"
            ),
        },
    )
    def get(self, request):
        now = timezone.now()
        start, end = _when(request, "from", now - timedelta(hours=24)), _when(request, "to", now)
        group_by = request.query_params.get("group_by", "owner")
        if group_by not in GROUPS:
            raise ValidationError({"group_by": f"must be one of {', '.join(GROUPS)}."})
        rows = UsageHour.objects.filter(hour__gte=start.replace(minute=0, second=0, microsecond=0), hour__lt=end)
        if not request.user.is_staff:
            rows = rows.filter(owner=request.user)
        results = report(rows, group_by)
        if request.query_params.get("export") == "csv":
            response = HttpResponse(as_csv(results), content_type="text/csv")
            response["Content-Disposition"] = f'attachment; filename="usage-by-{group_by}.csv"'
            return response
        return Response({"from": start.isoformat(), "to": end.isoformat(), "group_by": group_by, "results": results})
