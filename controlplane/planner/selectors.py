"""What the planner reads from the inventory: the CUDA devices a deployment may be placed on."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.inventory.models import Device
from controlplane.inventory.selectors import placeable_nodes


@dataclass(frozen=True)
class CudaNode:
    name: str
    devices: int  # healthy CUDA devices
    memory_bytes: int  # the smallest of them: placement may hand a replica any of them
    device_name: str


def cuda_nodes() -> list[CudaNode]:
    """Placeable nodes with healthy CUDA devices that report their memory, largest devices first."""
    found: dict[str, list[Device]] = {}
    devices = Device.objects.filter(
        node__in=placeable_nodes(), kind=Device.Kind.CUDA, health=Device.Health.HEALTHY, memory_total__gt=0
    ).select_related("node")
    for device in devices:
        found.setdefault(device.node.name, []).append(device)
    nodes = []
    for name, group in found.items():
        smallest = min(group, key=lambda d: d.memory_total)
        nodes.append(CudaNode(name, len(group), smallest.memory_total, smallest.name))
    return sorted(nodes, key=lambda n: (-n.memory_bytes, n.name))
