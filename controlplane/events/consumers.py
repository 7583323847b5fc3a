"""`/ws/events/`: live state changes (deployments, replicas, nodes, audit events)."""

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from controlplane.events.broadcast import GROUP


class EventsConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if not (user and user.is_authenticated):
            await self.close(code=4401)
            return
        await self.channel_layer.group_add(GROUP, self.channel_name)
        await self.accept()
        await self.send_json({"kind": "hello", "data": {"user": user.get_username()}})

    async def disconnect(self, code):
        await self.channel_layer.group_discard(GROUP, self.channel_name)

    async def state_message(self, message):
        await self.send_json({"kind": message["kind"], "data": message["data"]})
