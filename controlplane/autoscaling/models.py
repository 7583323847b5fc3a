"""A deployment's autoscaling: its settings, and what the autoscaler last decided (policy.py)."""

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from controlplane.deployments.models import Deployment


class Autoscaling(models.Model):
    class Mode(models.TextChoices):
        ADVISORY = "advisory"  # decide and show, change nothing
        ACTIVE = "active"  # scale the deployment

    deployment = models.OneToOneField(Deployment, on_delete=models.CASCADE, related_name="autoscaling")
    enabled = models.BooleanField(default=False)
    mode = models.CharField(max_length=8, choices=Mode.choices, default=Mode.ADVISORY)
    # At least 1: a deployment with no replica reports no demand to scale back up from.
    min_replicas = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1), MaxValueValidator(64)])
    max_replicas = models.PositiveSmallIntegerField(default=4, validators=[MinValueValidator(1), MaxValueValidator(64)])
    ttft_p90_ms = models.FloatField(default=2000.0, validators=[MinValueValidator(1.0)])
    itl_p90_ms = models.FloatField(default=200.0, validators=[MinValueValidator(1.0)])
    scale_down_cooldown_seconds = models.PositiveIntegerField(default=300)
    tolerance = models.FloatField(default=0.1, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)])
    capacity_profile = models.CharField(
        max_length=64,
        blank=True,
        default="",
        help_text="the step-time profile capacities come from (a shipped one's name); empty: the deployment's "
        "sim_profile, else cpu-demo",
    )
    # What the autoscaler last saw and decided (GET .../autoscaling/ shows it).
    recommendation = models.JSONField(default=dict, blank=True)
    last_change_at = models.DateTimeField(
        null=True, blank=True, help_text="when it last scaled (in advisory mode: last recommended a change)"
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"autoscaling of {self.deployment.slug}"
