from controlplane.inventory.models import Device, Node


def node_list():
    # No annotation: Django drops Meta.ordering from a GROUP BY query, and pages need an order.
    return Node.objects.prefetch_related("devices")


def device_list():
    return Device.objects.select_related("node")
