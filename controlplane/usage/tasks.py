from celery import shared_task

from controlplane.common import redis as redis_client


@shared_task(name="usage.flush", queue="control", ignore_result=True)
def flush_usage() -> int:
    """Beat, every 10 s: the gateway's usage counts into the hourly rows (services.flush)."""
    from controlplane.usage.services import flush

    return flush(redis_client.client())
