from controlplane.deployments.models import Replica
from controlplane.gateway.models import ApiKey


def api_keys_visible_to(user):
    """Staff see every key; others only their own; anonymous callers none."""
    qs = ApiKey.objects.select_related("owner").prefetch_related("allowed_deployments")
    if not user.is_authenticated:
        return qs.none()
    return qs if user.is_staff else qs.filter(owner=user)


def candidate_ids(deployment_id: int) -> dict[str, list[int]]:
    """Ready replicas of a deployment by what they do: "decode" (colocated or decode role) and
    "prefill". The caller is synchronous."""
    out: dict[str, list[int]] = {"decode": [], "prefill": []}
    rows = Replica.objects.filter(deployment_id=deployment_id, state=Replica.State.READY).order_by("id")
    for rid, role in rows.values_list("id", "role"):
        out["prefill" if role == Replica.Role.PREFILL else "decode"].append(rid)
    return out
