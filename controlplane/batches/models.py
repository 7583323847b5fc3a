"""Files and batches of OpenAI's Batch API, and a batch's lines: what the dispatcher sends, each
line's state and, once, its result. A batch's output and error files are rendered from its lines
(their results, in input order), so they can never hold a line twice or miss one."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from controlplane.gateway.models import ApiKey


class BatchFile(models.Model):
    """An uploaded file (`purpose` batch: its bytes in the file storage, storage.py), or a
    batch's output or error file (`batch` and `purpose` batch_output; no bytes stored)."""

    class Purpose(models.TextChoices):
        BATCH = "batch"
        BATCH_OUTPUT = "batch_output"

    id = models.CharField(primary_key=True, max_length=40)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="batch_files")
    purpose = models.CharField(max_length=16, choices=Purpose.choices)
    filename = models.CharField(max_length=255)
    bytes = models.BigIntegerField(default=0)
    lines = models.PositiveIntegerField(default=0)
    # An output file: the batch whose lines it renders, and which of them (the error file: not ok).
    batch = models.ForeignKey("Batch", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    errors_only = models.BooleanField(default=False)
    deleted = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.id


class Batch(models.Model):
    class Status(models.TextChoices):
        VALIDATING = "validating"
        FAILED = "failed"
        IN_PROGRESS = "in_progress"
        FINALIZING = "finalizing"
        COMPLETED = "completed"
        EXPIRED = "expired"
        CANCELLING = "cancelling"
        CANCELLED = "cancelled"

    ACTIVE = (Status.IN_PROGRESS, Status.FINALIZING, Status.CANCELLING)  # the dispatcher's to move on

    id = models.CharField(primary_key=True, max_length=40)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="batches")
    api_key = models.ForeignKey(ApiKey, null=True, on_delete=models.SET_NULL, related_name="batches")
    endpoint = models.CharField(max_length=32)
    model = models.CharField(max_length=100, blank=True, help_text="the deployment every line names")
    input_file = models.ForeignKey(BatchFile, null=True, on_delete=models.SET_NULL, related_name="batches")
    completion_window = models.CharField(max_length=8, default="24h")
    metadata = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.VALIDATING)
    errors = models.JSONField(null=True, blank=True, help_text="validation errors: [{code, message, param, line}]")
    output_file = models.ForeignKey(BatchFile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    error_file = models.ForeignKey(BatchFile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    total = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    # The dispatcher that holds the batch (one at a time): its token, and until when its lease runs.
    lease_owner = models.CharField(max_length=64, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "batches"

    def __str__(self) -> str:
        return self.id


class BatchLine(models.Model):
    """One request of a batch. `pending` -> `sent` (attempt n, by the dispatcher holding the
    batch) -> `done` (its result written, once: only the attempt that was sent may write it)."""

    class State(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        DONE = "done"

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="lines")
    index = models.PositiveIntegerField()
    custom_id = models.CharField(max_length=512)
    body = models.JSONField()
    state = models.CharField(max_length=8, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0, help_text="times sent: the current attempt's number")
    failures = models.PositiveSmallIntegerField(default=0, help_text="replica errors met (sent again up to a limit)")
    sent_by = models.CharField(max_length=64, blank=True)
    ok = models.BooleanField(default=False, help_text="answered with a 2xx (the output file); else the error file")
    result = models.JSONField(null=True, blank=True, help_text="the output line: {id, custom_id, response, error}")

    class Meta:
        ordering = ["batch", "index"]
        constraints = [models.UniqueConstraint(fields=["batch", "index"], name="batch_line_index")]
        indexes = [models.Index(fields=["batch", "state"])]

    def __str__(self) -> str:
        return f"{self.batch_id}:{self.index}"
