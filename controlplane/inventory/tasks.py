from celery import shared_task

from controlplane.inventory.services import mark_stale_nodes_offline


@shared_task(name="inventory.check_nodes", queue="control")
def check_nodes() -> list[str]:
    stale = mark_stale_nodes_offline()
    if stale:
        from controlplane.deployments.tasks import reconcile

        reconcile.delay()
    return [n.name for n in stale]
