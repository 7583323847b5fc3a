from rest_framework.routers import SimpleRouter

from controlplane.batches.api.views import BatchViewSet

router = SimpleRouter()
router.register("batches", BatchViewSet, basename="batch")
urlpatterns = router.urls
