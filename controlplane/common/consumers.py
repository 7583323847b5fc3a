"""Websocket consumers that stream a Channels group to signed-in users."""

from channels.generic.websocket import AsyncJsonWebsocketConsumer


class SignedInGroupConsumer(AsyncJsonWebsocketConsumer):
    """Refuses anonymous users (close 4401), then relays the messages sent to `group`."""

    group: str = ""

    async def connect(self):
        user = self.scope.get("user")
        if not (user and user.is_authenticated):
            await self.close(code=4401)
            return
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.joined(user)

    async def joined(self, user) -> None:
        """Called once the socket is accepted."""

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        """These sockets only push; what a client sends is ignored (not parsed: a frame that is
        not JSON, or nested too deep for it, would otherwise end the socket)."""

    async def disconnect(self, code):
        await self.channel_layer.group_discard(self.group, self.channel_name)
