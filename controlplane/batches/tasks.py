from celery import shared_task


@shared_task(name="batches.dispatch", ignore_result=True)
def dispatch() -> None:
    """Beat, every BATCH_DISPATCH_INTERVAL seconds: this worker's batch dispatcher runs
    (dispatcher.py; started again if it died). It finds the batches to send by itself."""
    from controlplane.batches.dispatcher import ensure_running

    ensure_running()
