from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "controlplane.deployments"
    label = "deployments"

    def ready(self) -> None:
        from controlplane.deployments import receivers  # noqa: F401 (connects them)
