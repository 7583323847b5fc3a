from django.db import models

from controlplane.events.broadcast import publish
from controlplane.events.models import Event


def record_event(
    verb: str,
    obj: models.Model | None = None,
    *,
    actor=None,
    actor_label: str = "",
    data: dict | None = None,
    object_type: str = "",
    object_id: str = "",
) -> Event:
    """Write an audit-log entry and broadcast it."""
    if obj is not None:
        object_type = object_type or obj._meta.model_name
        object_id = object_id or str(obj.pk)
    user = actor if getattr(actor, "is_authenticated", False) else None
    event = Event.objects.create(
        actor=user,
        actor_label=actor_label or (user.get_username() if user else "system"),
        verb=verb,
        object_type=object_type,
        object_id=object_id,
        object_repr=str(obj)[:200] if obj is not None else "",
        data=data or {},
    )
    publish("event", serialize(event))
    return event


def serialize(event: Event) -> dict:
    return {
        "id": event.id,
        "created_at": event.created_at.isoformat(),
        "actor": event.actor_label,
        "verb": event.verb,
        "object_type": event.object_type,
        "object_id": event.object_id,
        "object_repr": event.object_repr,
        "data": event.data,
    }
