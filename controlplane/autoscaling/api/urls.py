from django.urls import path

from controlplane.autoscaling.api.views import AutoscalingView

urlpatterns = [path("deployments/<slug:slug>/autoscaling/", AutoscalingView.as_view(), name="deployment-autoscaling")]
