"""Settings, URLs, ASGI and Celery apps: the one place configuration lives."""

from controlplane.config.celery_app import app as celery_app

__all__ = ["celery_app"]
