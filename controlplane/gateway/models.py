from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from controlplane.deployments.models import Deployment
from workers.protocol.replica import MAX_TENANT_WEIGHT, PRIORITY_LIMIT


class ApiKey(models.Model):
    """An application's key for the OpenAI-compatible API. Only a hash of the secret is kept;
    the secret itself is shown once, when the key is created."""

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, help_text="visible start of the key, to recognise it")
    hashed_secret = models.CharField(max_length=64, unique=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    allowed_deployments = models.ManyToManyField(
        Deployment, blank=True, related_name="api_keys", help_text="empty: every deployment"
    )
    rpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="requests per minute; empty: none")
    tpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="tokens per minute; empty: none")
    # Fair sharing (workers/engine/fair_share.py): the owner is the tenant; a request counts its
    # tokens divided by its key's weight, so a key of weight 2 gets twice a key of weight 1.
    weight = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.01), MaxValueValidator(MAX_TENANT_WEIGHT)],
        help_text="share of the engines against other tenants' keys under load (default 1)",
    )
    # Priorities (lower runs first, workers/engine/scheduler.py) are the operator's to grant: a key
    # may ask for its own requests to go later, never ahead of this.
    min_priority = models.IntegerField(
        default=0,
        validators=[MinValueValidator(-PRIORITY_LIMIT), MaxValueValidator(PRIORITY_LIMIT)],
        help_text="the most urgent priority the key may ask for (0: none ahead of the default; "
        "service_tier 'priority' is -1)",
    )
    revoked = models.BooleanField(default=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class StoredResponse(models.Model):
    """A /v1/responses answer kept (`store`, the default) so that a later request can continue
    it by `previous_response_id` and its owner can read or delete it. Only the key's owner
    sees it; `store: false` keeps nothing."""

    id = models.CharField(primary_key=True, max_length=64)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="stored_responses")
    api_key = models.ForeignKey(ApiKey, null=True, on_delete=models.SET_NULL, related_name="stored_responses")
    # The chat messages up to and including this answer, without `instructions` (which a
    # continuation does not inherit): what a request continuing it is prefixed with.
    conversation = models.JSONField()
    response = models.JSONField(help_text="the response object as it was returned")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.id
