"""The Celery app of the control worker and beat (Django's settings). Node agents run their own
app without Django (workers/agent/__main__.py); the two meet only on task names and queues."""

import os

from celery import Celery

from workers.protocol.broker import survive_broker_loss_with_tasks_in_flight

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.config.settings")
survive_broker_loss_with_tasks_in_flight()

app = Celery("switchyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(
    [
        "controlplane.autoscaling",
        "controlplane.batches",
        "controlplane.catalog",
        "controlplane.deployments",
        "controlplane.inventory",
        "controlplane.telemetry",
        "controlplane.usage",
    ]
)
