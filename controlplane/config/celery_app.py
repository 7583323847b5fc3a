"""The Celery app of the control worker and beat (Django's settings). Node agents run their own
app without Django (workers/agent/__main__.py); the two meet only on task names and queues."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.config.settings")

app = Celery("switchyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(
    [
        "controlplane.catalog",
        "controlplane.deployments",
        "controlplane.inventory",
        "controlplane.telemetry",
    ]
)
