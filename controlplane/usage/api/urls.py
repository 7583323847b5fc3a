from django.urls import path

from controlplane.usage.api.views import UsageView

urlpatterns = [path("usage/", UsageView.as_view(), name="usage")]
