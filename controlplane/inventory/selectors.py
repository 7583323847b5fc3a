from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from controlplane.inventory.models import Device, Node


def node_list():
    # No annotation: Django drops Meta.ordering from a GROUP BY query, and pages need an order.
    return Node.objects.prefetch_related("devices")


def device_list():
    return Device.objects.select_related("node")


def placeable_nodes():
    """Online nodes whose agent is heartbeating: a node left `online` by an agent that died has
    a stale heartbeat until `mark_stale_nodes_offline` gets to it, and a replica placed on it in
    the meantime would only be stopped again."""
    cutoff = timezone.now() - timedelta(seconds=settings.SWITCHYARD["NODE_STALE_SECONDS"])
    return Node.objects.filter(status=Node.Status.ONLINE, last_heartbeat__gte=cutoff)
