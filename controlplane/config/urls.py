from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from controlplane.common.views import healthz
from controlplane.telemetry.views import metrics

api_v1 = [
    path("", include("controlplane.catalog.api.urls")),
    path("", include("controlplane.inventory.api.urls")),
    path("", include("controlplane.deployments.api.urls")),
    path("", include("controlplane.gateway.api.urls")),
    path("", include("controlplane.events.api.urls")),
    path("", include("controlplane.telemetry.api.urls")),
]

urlpatterns = [
    # The admin console (frontend/) will be served here; until then, the API docs.
    path("", RedirectView.as_view(url="/api/docs/", permanent=False)),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    path("v1/", include("controlplane.gateway.openai_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api-auth/", include("rest_framework.urls")),
]
