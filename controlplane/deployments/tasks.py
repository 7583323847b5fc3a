from celery import shared_task

from controlplane.deployments.services import reconcile_all


@shared_task(name="deployments.reconcile", queue="control")
def reconcile() -> dict:
    """Idempotent: safe to run any number of times, from beat or after any change."""
    return reconcile_all()
