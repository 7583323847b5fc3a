from asgiref.sync import async_to_sync
from celery import shared_task
from channels.layers import get_channel_layer

from controlplane.common import redis as redis_client
from controlplane.telemetry.history import GROUP, sample


@shared_task(name="telemetry.sample", queue="control", ignore_result=True)
def sample_metrics() -> int:
    """Every second (beat): one history point per deployment, also pushed to live consoles."""
    points = sample(redis_client.client())
    if points:
        async_to_sync(get_channel_layer().group_send)(GROUP, {"type": "metrics.points", "points": points})
    return len(points)
