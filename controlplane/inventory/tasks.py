from celery import shared_task

from controlplane.inventory.services import mark_stale_nodes_offline


@shared_task(name="inventory.check_nodes", queue="control")
def check_nodes() -> list[str]:
    """Stale nodes go offline; their replicas' stopping asks for a reconcile (transition_replica)."""
    return [n.name for n in mark_stale_nodes_offline()]
