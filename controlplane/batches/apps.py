from django.apps import AppConfig


class BatchesConfig(AppConfig):
    name = "controlplane.batches"
    label = "batches"
    default_auto_field = "django.db.models.BigAutoField"
