from django.urls import path

from controlplane.planner.api.views import PlanView

urlpatterns = [path("plan/", PlanView.as_view(), name="plan")]
