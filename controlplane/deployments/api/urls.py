from rest_framework.routers import SimpleRouter

from controlplane.deployments.api.views import CachePolicyViewSet, DeploymentViewSet, ReplicaViewSet

router = SimpleRouter()
router.register("deployments", DeploymentViewSet, basename="deployment")
router.register("cache-policies", CachePolicyViewSet, basename="cache-policy")
router.register("replicas", ReplicaViewSet, basename="replica")
urlpatterns = router.urls
