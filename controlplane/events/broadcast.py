"""Push state changes to `/ws/events/` listeners through the channel layer (after commit)."""

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

GROUP = "events"


def publish(kind: str, payload: dict) -> None:
    """Send `{kind, data}` to every connected client once the current transaction commits."""

    def send():
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(GROUP, {"type": "state.message", "kind": kind, "data": payload})
        except Exception:  # a realtime hiccup must never fail the control action itself
            log.warning("could not publish %s to the channel layer", kind, exc_info=True)

    transaction.on_commit(send)
