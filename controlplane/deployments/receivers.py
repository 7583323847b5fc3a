"""The deployments app's answers to other apps' signals (connected in apps.py's ready())."""

from django.dispatch import receiver

from controlplane.deployments.replica_states import stop_replicas_on_node
from controlplane.inventory.signals import node_went_silent


@receiver(node_went_silent, dispatch_uid="deployments.stop_replicas_of_silent_node")
def stop_replicas_of_silent_node(sender, node, reason: str, **kwargs) -> None:
    stop_replicas_on_node(node, reason=reason)
