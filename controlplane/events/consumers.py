"""`/ws/events/`: live state changes (deployments, replicas, nodes, audit events)."""

from controlplane.common.consumers import SignedInGroupConsumer
from controlplane.events.broadcast import GROUP


class EventsConsumer(SignedInGroupConsumer):
    group = GROUP

    async def joined(self, user) -> None:
        await self.send_json({"kind": "hello", "data": {"user": user.get_username()}})

    async def state_message(self, message):
        await self.send_json({"kind": message["kind"], "data": message["data"]})
