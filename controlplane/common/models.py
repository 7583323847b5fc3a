from django.conf import settings
from django.db import models


class ManagementToken(models.Model):
    """A bearer token for the management API (`/api/v1/`), acting as its user. Only a hash of
    the secret is kept; the secret is printed once, by `manage.py create_token`."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="management_tokens")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, db_index=True, help_text="visible start of the token, to recognise it")
    hashed_secret = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.user} {self.name or 'token'} ({self.prefix}…)"
