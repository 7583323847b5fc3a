from django.db import models


class Node(models.Model):
    """A machine running a node agent (a Celery worker listening on `queue`)."""

    class Status(models.TextChoices):
        ONLINE = "online"
        OFFLINE = "offline"
        DRAINING = "draining"

    name = models.SlugField(max_length=100, unique=True)
    queue = models.CharField(max_length=120, unique=True)
    hostname = models.CharField(max_length=200, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.ONLINE)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    last_report_ns = models.BigIntegerField(
        default=0, help_text="when its agent made the last report applied (a late, older one is ignored)"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Device(models.Model):
    class Kind(models.TextChoices):
        CUDA = "cuda"
        CPU = "cpu"

    class Health(models.TextChoices):
        HEALTHY = "healthy"
        DEGRADED = "degraded"
        UNHEALTHY = "unhealthy"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    index = models.PositiveSmallIntegerField()
    kind = models.CharField(max_length=8, choices=Kind.choices)
    name = models.CharField(max_length=200)
    memory_total = models.BigIntegerField(default=0)
    memory_used = models.BigIntegerField(default=0)
    utilization = models.FloatField(default=0.0, help_text="0–100 %")
    health = models.CharField(max_length=10, choices=Health.choices, default=Health.HEALTHY)
    last_seen = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="device_unique_index_per_node")]

    def __str__(self) -> str:
        return f"{self.node.name}/{self.kind}:{self.index}"
