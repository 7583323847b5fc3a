from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.events.broadcast import publish
from controlplane.events.services import record_event
from controlplane.inventory.models import Device, Node
from controlplane.inventory.signals import node_came_online, node_went_silent
from workers.protocol.control import node_queue


def node_reported(name: str, hostname: str, devices: list[dict], at_ns: int) -> Node | None:
    """An agent's report (made at `at_ns` by the agent's clock) arrived: a node that is new, or
    was offline, (re-)registers with its devices; an online one has its heartbeat and device
    figures refreshed. A report older than one already applied changes nothing (None)."""
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=name).first()
        if node is not None and at_ns <= node.last_report_ns:
            return None
        now = timezone.now()
        if node is None or node.status != Node.Status.ONLINE:
            node = register_node(name=name, hostname=hostname, devices=devices)
        else:
            for d in devices:
                Device.objects.filter(node=node, index=d["index"]).update(
                    memory_used=d.get("memory_used", 0),
                    utilization=d.get("utilization", 0.0),
                    health=d.get("health", Device.Health.HEALTHY),
                    last_seen=now,
                )
        Node.objects.filter(pk=node.pk).update(last_heartbeat=now, last_report_ns=at_ns)
    return node


@transaction.atomic
def register_node(*, name: str, hostname: str = "", labels: dict | None = None, devices: list[dict]) -> Node:
    """Create or refresh a Node and its Devices (from its agent's first report)."""
    now = timezone.now()
    node, created = Node.objects.update_or_create(
        name=name,
        defaults={
            "queue": node_queue(name),
            "hostname": hostname,
            "labels": labels or {},
            "status": Node.Status.ONLINE,
            "last_heartbeat": now,
        },
    )
    seen = []
    for d in devices:
        Device.objects.update_or_create(
            node=node,
            index=d["index"],
            defaults={
                "kind": d["kind"],
                "name": d["name"],
                "memory_total": d.get("memory_total", 0),
                "memory_used": d.get("memory_used", 0),
                "utilization": d.get("utilization", 0.0),
                "health": d.get("health", Device.Health.HEALTHY),
                "last_seen": now,
            },
        )
        seen.append(d["index"])
    node.devices.exclude(index__in=seen).delete()
    record_event(
        "node.registered" if created else "node.online", node, actor_label=f"agent:{name}", data={"devices": len(seen)}
    )
    publish("node", {"name": node.name, "status": node.status})
    node_came_online.send(sender=Node, node=node)
    return node


def node_left(name: str, reason: str, at_ns: int) -> Node | None:
    """The node's agent stopped cleanly: offline now, not after NODE_STALE_SECONDS."""
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=name).first()
        if node is None or at_ns <= node.last_report_ns:
            return node
        node.last_report_ns = at_ns
        if node.status == Node.Status.OFFLINE:
            node.save(update_fields=["last_report_ns"])
            return node
        node.status = Node.Status.OFFLINE
        node.save(update_fields=["status", "last_report_ns"])
        record_event("node.offline", node, actor_label=f"agent:{name}", data={"reason": reason})
        publish("node", {"name": node.name, "status": node.status})
    return node


def mark_stale_nodes_offline() -> list[Node]:
    """Nodes whose heartbeat is older than NODE_STALE_SECONDS go offline; their replicas are
    stopped so the reconciler places them elsewhere (the deployments app does that, on the
    `node_went_silent` signal, in the same transaction)."""
    cutoff = timezone.now() - timedelta(seconds=settings.SWITCHYARD["NODE_STALE_SECONDS"])
    stale = list(Node.objects.filter(status__in=[Node.Status.ONLINE, Node.Status.DRAINING], last_heartbeat__lt=cutoff))
    for node in stale:
        with transaction.atomic():
            node.status = Node.Status.OFFLINE
            node.save(update_fields=["status"])
            record_event(
                "node.offline",
                node,
                actor_label="health-check",
                data={"last_heartbeat": node.last_heartbeat.isoformat()},
            )
            publish("node", {"name": node.name, "status": node.status})
            node_went_silent.send(sender=Node, node=node, reason=f"node {node.name} stopped heartbeating")
    return stale
