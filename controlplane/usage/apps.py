from django.apps import AppConfig


class UsageConfig(AppConfig):
    name = "controlplane.usage"
    label = "usage"
    default_auto_field = "django.db.models.BigAutoField"
