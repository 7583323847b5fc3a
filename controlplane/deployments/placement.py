"""Where a new replica goes: a node online and schedulable with enough healthy devices free
(a CUDA device holds one replica, a CPU device CPU_REPLICAS_PER_DEVICE), the least loaded node
first; and, when none has room, why, in words for the console."""

from __future__ import annotations

from django.conf import settings
from django.db.models import Count, Q

from controlplane.deployments.models import Deployment, Replica
from controlplane.inventory.models import Device, Node
from controlplane.inventory.selectors import placeable_nodes


def free_devices(node: Node, kind: str | None = None) -> list[Device]:
    """Devices of `node` with room for one more replica (CPU devices host several)."""
    per_cpu = settings.SWITCHYARD["CPU_REPLICAS_PER_DEVICE"]
    devices = node.devices.filter(health=Device.Health.HEALTHY).annotate(
        used=Count("replicas", filter=Q(replicas__state__in=Replica.LIVE_STATES))
    )
    free = [d for d in devices if d.used < (per_cpu if d.kind == Device.Kind.CPU else 1)]
    return [d for d in free if kind is None or d.kind == kind]


def place(dep: Deployment) -> tuple[Node, list[Device]] | None:
    need = dep.devices_per_replica
    nodes = (
        placeable_nodes()
        .annotate(load=Count("replicas", filter=Q(replicas__state__in=Replica.LIVE_STATES)))
        .order_by("load", "name")
    )
    for node in nodes:
        for kind in (Device.Kind.CUDA, Device.Kind.CPU):
            free = free_devices(node, kind)
            if kind == Device.Kind.CPU and len(free) >= need:
                # CPU replicas share the node's CPU devices; a parallel one takes one per rank.
                return node, free[:need]
            if len(free) >= need:
                return node, free[:need]
    return None


def placement_problem(dep: Deployment) -> str:
    """Why `place` found no room, in words for the console."""
    nodes = list(placeable_nodes().order_by("name"))
    if not nodes:
        return "no online node"
    need = dep.devices_per_replica
    rooms = []
    for node in nodes:
        healthy = node.devices.filter(health=Device.Health.HEALTHY).count()
        rooms.append(
            f"{node.name}: {len(free_devices(node))} of {healthy} healthy devices free"
            if healthy
            else f"{node.name}: no healthy device"
        )
    return f"no online node has room for a replica ({need} device{'s' if need > 1 else ''}): " + "; ".join(rooms)


def room_for(dep: Deployment) -> int:
    """How many more replicas of `dep` the online nodes can place now (the autoscaler's bound)."""
    per_cpu = settings.SWITCHYARD["CPU_REPLICAS_PER_DEVICE"]
    need = dep.devices_per_replica
    room = 0
    for node in placeable_nodes():
        devices = node.devices.filter(health=Device.Health.HEALTHY).annotate(
            used=Count("replicas", filter=Q(replicas__state__in=Replica.LIVE_STATES))
        )
        cuda = sum(1 for d in devices if d.kind == Device.Kind.CUDA and d.used < 1)
        cpu = sum(max(per_cpu - d.used, 0) for d in devices if d.kind == Device.Kind.CPU)
        room += cuda // need + cpu // need  # a parallel CPU replica takes a slot on `need` devices: a bound
    return room
