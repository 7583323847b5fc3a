from controlplane.deployments.models import CachePolicy, Deployment, Replica


def deployment_list():
    return Deployment.objects.select_related("model", "cache_policy", "draft_model")


def replica_list():
    return Replica.objects.select_related("deployment", "node").prefetch_related("devices")


def cache_policy_list():
    return CachePolicy.objects.all()


def ready_replicas(deployment: Deployment, role: str | None = None):
    qs = deployment.replica_set.filter(state=Replica.State.READY)
    return qs.filter(role=role) if role else qs
