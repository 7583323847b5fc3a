"""Hourly usage rows, and the flushes already applied (so that none is counted twice)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models.functions import Coalesce

from controlplane.gateway.models import ApiKey


class UsageHour(models.Model):
    """What one owner's key used of one deployment in one hour (the console's requests: no key)."""

    hour = models.DateTimeField(help_text="the hour's start (UTC)")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    deployment = models.CharField(max_length=100, help_text="the deployment's slug (kept if it is deleted)")
    requests = models.PositiveBigIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    cached_tokens = models.PositiveBigIntegerField(default=0, help_text="of the input tokens, served from a cache")
    output_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-hour"]
        constraints = [  # one row per hour, owner, key (none: 0) and deployment
            models.UniqueConstraint(
                "hour", Coalesce("owner", 0), Coalesce("api_key", 0), "deployment", name="usage_hour_row"
            )
        ]
        indexes = [models.Index(fields=["hour"])]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h {self.owner_id}/{self.api_key_id} {self.deployment}"


class UsageFlush(models.Model):
    """A batch of counts moved from Redis: recorded with them, so a flush retried after a crash
    between the database commit and the Redis delete adds nothing twice."""

    key = models.CharField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
