from controlplane.gateway.models import ApiKey


def api_keys_visible_to(user):
    """Staff see every key; others only their own; anonymous callers none."""
    qs = ApiKey.objects.select_related("owner").prefetch_related("allowed_deployments")
    if not user.is_authenticated:
        return qs.none()
    return qs if user.is_staff else qs.filter(owner=user)
