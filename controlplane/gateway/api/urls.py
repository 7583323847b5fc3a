from django.urls import path
from rest_framework.routers import SimpleRouter

from controlplane.gateway.api.views import ApiKeyViewSet, RecentRequestsView

router = SimpleRouter()
router.register("api-keys", ApiKeyViewSet, basename="api-key")
urlpatterns = [
    path("deployments/<slug:slug>/requests/", RecentRequestsView.as_view(), name="deployment-requests"),
    *router.urls,
]
