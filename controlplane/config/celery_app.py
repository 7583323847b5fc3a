"""The Celery app shared by the control worker, beat and every node agent."""

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
        "workers.agent",
    ]
)
