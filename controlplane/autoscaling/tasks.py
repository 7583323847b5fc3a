from celery import shared_task

from controlplane.autoscaling import services
from controlplane.deployments.messaging import CONTROL_QUEUE


@shared_task(name="autoscaling.tick", queue=CONTROL_QUEUE)
def tick() -> dict:
    """Beat, every AUTOSCALE_INTERVAL seconds: one decision per autoscaled deployment."""
    return services.tick()
