from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from controlplane.config.views import healthz, read_only, static, version
from controlplane.console import views as console
from controlplane.gateway.dialects.tokenize import views as tokenize_views
from controlplane.telemetry.views import metrics

api_v1 = [
    path("", include("controlplane.catalog.api.urls")),
    path("", include("controlplane.inventory.api.urls")),
    path("", include("controlplane.autoscaling.api.urls")),
    path("", include("controlplane.deployments.api.urls")),
    path("", include("controlplane.gateway.api.urls")),
    path("", include("controlplane.batches.api.urls")),
    path("", include("controlplane.usage.api.urls")),
    path("", include("controlplane.events.api.urls")),
    path("", include("controlplane.telemetry.api.urls")),
    path("", include("controlplane.planner.api.urls")),
    path("auth/login/", console.LoginView.as_view(), name="auth-login"),
    path("auth/logout/", console.LogoutView.as_view(), name="auth-logout"),
    path("auth/me/", console.MeView.as_view(), name="auth-me"),
]

# The pages the console routes in the browser (frontend/src/App.tsx; a test compares the two).
CONSOLE_PAGES = (
    r"^(?:deployments(?:/[^/]+)?|models|inventory|cache-policies|api-keys|batches|usage|events|playground)/?$"
)

urlpatterns = [
    path("", read_only(console.spa), name="console"),
    re_path(CONSOLE_PAGES, read_only(console.spa)),
    re_path(r"^assets/(?P<path>.+)$", console.assets),
    re_path(r"^static/(?P<path>.+)$", static),
    path("health", healthz, name="health"),
    path("healthz", healthz, name="healthz"),
    path("version", version, name="version"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    path("v1/", include("controlplane.gateway.dialects.urls")),
    # vLLM serves these outside /v1 (and so here too; /v1/tokenize is the same view).
    path("tokenize", tokenize_views.tokenize, name="tokenize"),
    path("detokenize", tokenize_views.detokenize, name="detokenize"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api-auth/", include("rest_framework.urls")),
]
# Anything else is a JSON 404, not the console: a probe of /health-like paths must not see a page.
handler404 = "controlplane.config.views.not_found"
