from rest_framework.routers import SimpleRouter

from controlplane.catalog.api.views import ModelViewSet

router = SimpleRouter()
router.register("models", ModelViewSet, basename="model")
urlpatterns = router.urls
