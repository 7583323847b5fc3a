from django.db.models import Count, Q

from controlplane.inventory.models import Device, Node


def node_list():
    # No annotation: Django drops Meta.ordering from a GROUP BY query, and pages need an order.
    return Node.objects.prefetch_related("devices")


def device_list():
    return Device.objects.select_related("node")


def online_nodes():
    return Node.objects.filter(status=Node.Status.ONLINE)


def max_devices_per_node(kind: str | None = None) -> int:
    """Most devices on any online node (of `kind`), for parallelism validation."""
    devices = Q(devices__kind=kind) if kind else Q()
    counts = online_nodes().annotate(n=Count("devices", filter=devices)).values_list("n", flat=True)
    return max(counts, default=0)
