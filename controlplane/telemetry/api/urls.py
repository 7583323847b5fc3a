from django.urls import path

from controlplane.telemetry.api.views import MetricsHistoryView

urlpatterns = [path("telemetry/history/", MetricsHistoryView.as_view(), name="telemetry-history")]
