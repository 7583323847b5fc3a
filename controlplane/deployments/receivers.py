"""The deployments app's answers to other apps' signals (connected in apps.py's ready())."""

from django.dispatch import receiver

from controlplane.deployments.messaging import schedule_reconcile
from controlplane.deployments.replica_states import stop_replicas_on_node
from controlplane.inventory.signals import node_came_online, node_went_silent


@receiver(node_went_silent, dispatch_uid="deployments.stop_replicas_of_silent_node")
def stop_replicas_of_silent_node(sender, node, reason: str, **kwargs) -> None:
    stop_replicas_on_node(node, reason=reason)


@receiver(node_came_online, dispatch_uid="deployments.reconcile_for_new_node")
def reconcile_for_new_node(sender, node, **kwargs) -> None:
    schedule_reconcile()
