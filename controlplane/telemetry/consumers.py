"""`/ws/metrics/`: one message a second with the newest point of every deployment (see history)."""

from controlplane.common.consumers import SignedInGroupConsumer
from controlplane.telemetry.history import GROUP


class MetricsConsumer(SignedInGroupConsumer):
    group = GROUP

    async def metrics_points(self, message):
        await self.send_json({"kind": "metrics", "points": message["points"]})
