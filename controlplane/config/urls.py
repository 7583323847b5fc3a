from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from controlplane.common.views import healthz
from controlplane.console import views as console
from controlplane.telemetry.views import metrics

api_v1 = [
    path("", include("controlplane.catalog.api.urls")),
    path("", include("controlplane.inventory.api.urls")),
    path("", include("controlplane.deployments.api.urls")),
    path("", include("controlplane.gateway.api.urls")),
    path("", include("controlplane.events.api.urls")),
    path("", include("controlplane.telemetry.api.urls")),
    path("auth/login/", console.LoginView.as_view(), name="auth-login"),
    path("auth/logout/", console.LogoutView.as_view(), name="auth-logout"),
    path("auth/me/", console.MeView.as_view(), name="auth-me"),
]

urlpatterns = [
    path("", console.spa, name="console"),
    re_path(r"^assets/(?P<path>.+)$", console.assets),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    path("v1/", include("controlplane.gateway.openai_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api-auth/", include("rest_framework.urls")),
    # Everything else is a page of the console, which routes it in the browser.
    re_path(r"^(?P<path>(?!api/|v1/|admin/|ws/|static/|assets/).*)$", console.spa),
]
