from django.apps import AppConfig


class AutoscalingConfig(AppConfig):
    name = "controlplane.autoscaling"
    label = "autoscaling"
