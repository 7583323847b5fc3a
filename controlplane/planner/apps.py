from django.apps import AppConfig


class PlannerConfig(AppConfig):
    name = "controlplane.planner"
    label = "planner"
    verbose_name = "Capacity planner"
