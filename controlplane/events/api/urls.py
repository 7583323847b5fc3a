from rest_framework.routers import SimpleRouter

from controlplane.events.api.views import EventViewSet

router = SimpleRouter()
router.register("events", EventViewSet, basename="event")
urlpatterns = router.urls
