"""`/ws/metrics/`: one message a second with the newest point of every deployment (see history)."""

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from controlplane.telemetry.history import GROUP


class MetricsConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if not (user and user.is_authenticated):
            await self.close(code=4401)
            return
        await self.channel_layer.group_add(GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        await self.channel_layer.group_discard(GROUP, self.channel_name)

    async def metrics_points(self, message):
        await self.send_json({"kind": "metrics", "points": message["points"]})
