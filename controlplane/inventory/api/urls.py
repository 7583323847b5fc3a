from rest_framework.routers import SimpleRouter

from controlplane.inventory.api.views import DeviceViewSet, NodeViewSet

router = SimpleRouter()
router.register("nodes", NodeViewSet, basename="node")
router.register("devices", DeviceViewSet, basename="device")
urlpatterns = router.urls
