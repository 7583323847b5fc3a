from django.db import models

from workers.protocol.draft_models import EAGLE3_ARCHITECTURES


class Model(models.Model):
    """A model the platform can serve: weights in a local directory (or a hub id, recorded for
    a later download), with what was read from its files."""

    class Source(models.TextChoices):
        LOCAL = "local", "local directory"
        HUB = "hub", "hub id"

    class Status(models.TextChoices):
        REGISTERED = "registered"
        VALIDATING = "validating"
        READY = "ready"
        ERROR = "error"

    name = models.SlugField(max_length=100, unique=True)
    source_type = models.CharField(max_length=8, choices=Source.choices, default=Source.LOCAL)
    source = models.CharField(max_length=500, help_text="local directory path, or hub id such as org/name")
    architecture = models.CharField(max_length=100, blank=True)
    parameter_count = models.BigIntegerField(null=True, blank=True)
    dtype = models.CharField(max_length=16, blank=True)
    bytes_on_disk = models.BigIntegerField(null=True, blank=True)
    checksum = models.CharField(max_length=64, blank=True, help_text="sha256 over the weight files")
    context_length = models.PositiveIntegerField(null=True, blank=True)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.REGISTERED)
    status_message = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_draft(self) -> bool:
        """An EAGLE-3 head: it drafts tokens for a target model and is not served on its own."""
        return self.architecture in EAGLE3_ARCHITECTURES
