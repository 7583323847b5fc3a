from celery import shared_task

from controlplane.common import redis as redis_client


@shared_task(name="usage.flush", queue="control", ignore_result=True)
def flush_usage() -> int:
    """Beat, every USAGE_FLUSH_INTERVAL seconds (10): the gateway's usage counts into hourly rows."""
    from controlplane.usage.services import flush

    return flush(redis_client.client())
