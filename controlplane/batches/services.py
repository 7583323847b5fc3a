"""Files and batches as OpenAI's Batch API defines them: uploading a JSONL file of requests,
creating a batch from it (its lines validated up front), cancelling it, and the output and
error files, rendered from the batch's lines once it ends.

A batch's life: `validating` (its lines are checked as the batch is created: the first bad ones
fail it, `failed`, with their line numbers) -> `in_progress` (the dispatcher sends its lines,
dispatcher.py) -> `finalizing` -> `completed`; or, from `in_progress`, `cancelling` ->
`cancelled` (POST .../cancel) or `expired` (its 24 h window ended). A line that was not answered
when the batch ended gets an error line (`batch_cancelled`, `batch_expired`), so the output and
error files together hold every `custom_id` exactly once.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from controlplane.batches.models import Batch, BatchFile, BatchLine
from controlplane.batches.storage import get_storage
from controlplane.events.services import record_event
from controlplane.gateway.core import GatewayError, bad

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
COMPLETION_WINDOWS = {"24h": timedelta(hours=24)}
MAX_ERRORS = 100  # validation errors reported per batch
MAX_METADATA = 16  # OpenAI's metadata: at most 16 pairs, keys of 64 characters, values of 512


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def clean_id(value: str) -> str:
    """An id as a client sent it, safe to query with (no NUL, which PostgreSQL refuses)."""
    return value[:40].replace("\x00", "")


def _ts(when) -> int | None:
    return int(when.timestamp()) if when is not None else None


# -- files -----------------------------------------------------------------------------------------
def file_object(f: BatchFile) -> dict:
    return {
        "id": f.id, "object": "file", "bytes": f.bytes, "created_at": _ts(f.created_at), "filename": f.filename,
        "purpose": f.purpose, "status": "processed", "expires_at": None, "status_details": None,
    }  # fmt: skip


def check_lines(chunks: Iterator[bytes]) -> tuple[list[str], int]:
    """An upload's lines (JSONL: each a JSON object), and its size. A 400 names the first line
    that is not, or a file over the limits."""
    data = b"".join(chunks)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise bad("The file is not UTF-8 text.", "file", "invalid_file_format") from None
    lines = jsonl_lines(text)
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise bad("The file has no lines: a batch file holds one JSON request per line.", "file", "invalid_file_format")
    if len(lines) > settings.BATCH_MAX_LINES:
        raise bad(
            f"The file has {len(lines)} lines; a batch holds at most {settings.BATCH_MAX_LINES}.",
            "file",
            "invalid_file_format",
        )
    for number, line in enumerate(lines, 1):
        try:
            ok = isinstance(json.loads(line), dict)
        except ValueError:
            ok = False
        if not ok:
            raise bad(f"Line {number} of the file is not a JSON object.", "file", "invalid_file_format")
    return lines, len(data)


def jsonl_lines(text: str) -> list[str]:
    """JSONL's lines: split at newlines only (JSON strings may hold U+2028 and the like raw)."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def create_file(owner, filename: str, purpose: str, chunks: Iterator[bytes]) -> BatchFile:
    if purpose != BatchFile.Purpose.BATCH:
        raise bad(f"'purpose' must be 'batch' (files hold batch input here), got {str(purpose)[:40]!r}.", "purpose")
    lines, size = check_lines(chunks)
    file_id = new_id("file-")
    get_storage().save(file_id, iter([("\n".join(lines) + "\n").encode()]))
    return BatchFile.objects.create(
        id=file_id, owner=owner, purpose=purpose, filename=filename[:255] or "batch.jsonl", bytes=size, lines=len(lines)
    )


def owned_file(owner_id: int, file_id: str) -> BatchFile:
    f = BatchFile.objects.filter(pk=clean_id(file_id), owner_id=owner_id, deleted=False).first()
    if f is None:
        raise GatewayError(404, f"No such File object: {clean_id(file_id)}", "id", "not_found")
    return f


def delete_file(f: BatchFile) -> None:
    f.deleted = True
    f.save(update_fields=["deleted"])
    if f.batch_id is None:
        get_storage().delete(f.id)


def file_content(f: BatchFile) -> Iterator[bytes]:
    """An uploaded file's bytes, or an output file rendered from its batch's lines."""
    if f.batch_id is None:
        return get_storage().open(f.id)
    return _rendered(f)


def _rendered(f: BatchFile) -> Iterator[bytes]:
    lines = BatchLine.objects.filter(batch_id=f.batch_id, state=BatchLine.State.DONE, ok=not f.errors_only)
    for result in lines.order_by("index").values_list("result", flat=True).iterator(chunk_size=2000):
        yield (json.dumps(result) + "\n").encode()


# -- batches ---------------------------------------------------------------------------------------
def batch_object(b: Batch) -> dict:
    errors = {"object": "list", "data": b.errors} if b.errors else None
    return {
        "id": b.id, "object": "batch", "endpoint": b.endpoint, "model": b.model or None, "errors": errors,
        "input_file_id": b.input_file_id,
        "completion_window": b.completion_window, "status": b.status, "output_file_id": b.output_file_id,
        "error_file_id": b.error_file_id, "created_at": _ts(b.created_at), "in_progress_at": _ts(b.in_progress_at),
        "expires_at": _ts(b.expires_at), "finalizing_at": _ts(b.finalizing_at), "completed_at": _ts(b.completed_at),
        "failed_at": _ts(b.failed_at), "expired_at": _ts(b.expired_at), "cancelling_at": _ts(b.cancelling_at),
        "cancelled_at": _ts(b.cancelled_at),
        "request_counts": {"total": b.total, "completed": b.completed, "failed": b.failed}, "metadata": b.metadata,
    }  # fmt: skip


def check_metadata(value) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA:
        raise bad(f"'metadata' must be an object of at most {MAX_METADATA} pairs.", "metadata", "invalid_type")
    for key, item in value.items():
        if len(key) > 64 or not isinstance(item, str) or len(item) > 512:
            raise bad("'metadata' keys are strings of at most 64 characters, its values of at most 512.", "metadata")
    return value


def create_batch(caller, body: dict, validate) -> Batch:
    """A batch of the caller's file, validated now (`validate(lines, endpoint, caller)` returns
    the lines' bodies, or raises BatchInvalid); in_progress, or failed with its errors."""
    from controlplane.gateway.core.checks import refuse_unknown

    refuse_unknown(body, {"input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after"}, {})
    if body.get("output_expires_after") is not None:
        raise bad(
            "'output_expires_after' is not supported yet: output files are kept until deleted.",
            "output_expires_after",
            "unsupported",
        )
    file_id, endpoint, window = body.get("input_file_id"), body.get("endpoint"), body.get("completion_window")
    if not isinstance(file_id, str) or not file_id:
        raise bad(
            "'input_file_id' is required: the id of a file uploaded with purpose 'batch'.", "input_file_id", "missing"
        )
    if endpoint not in ENDPOINTS:
        raise bad(f"'endpoint' must be one of {', '.join(ENDPOINTS)}.", "endpoint")
    if window not in COMPLETION_WINDOWS:
        raise bad("'completion_window' must be '24h'.", "completion_window")
    metadata = check_metadata(body.get("metadata"))
    owner_id = caller.key.owner_id
    f = BatchFile.objects.filter(pk=clean_id(file_id), owner_id=owner_id, deleted=False).first()
    if f is None or f.purpose != BatchFile.Purpose.BATCH:
        raise bad(f"No file '{clean_id(file_id)}' with purpose 'batch' was found.", "input_file_id", "not_found")
    try:
        text = b"".join(get_storage().open(f.id)).decode()
    except FileNotFoundError:
        raise GatewayError(
            409,
            f"The content of file {f.id} is not in this web process's file storage: with several web processes, "
            "BATCH_FILES_DIR must be a directory they share (docs/serving.md, Batches).",
            "input_file_id",
            "file_unavailable",
        ) from None
    now = timezone.now()
    batch = Batch.objects.create(
        id=new_id("batch_"), owner_id=owner_id, api_key=caller.key, endpoint=endpoint, input_file=f,
        completion_window=window, metadata=metadata, expires_at=now + COMPLETION_WINDOWS[window],
    )  # fmt: skip
    try:
        bodies = validate([line for line in jsonl_lines(text) if line.strip()], endpoint, caller)
    except BatchInvalid as exc:
        Batch.objects.filter(pk=batch.pk, status=Batch.Status.VALIDATING).update(
            status=Batch.Status.FAILED, errors=exc.errors, failed_at=timezone.now()
        )
        batch.refresh_from_db()
        return batch
    with transaction.atomic():
        BatchLine.objects.bulk_create(
            [BatchLine(batch=batch, index=i, custom_id=cid, body=b) for i, (cid, b) in enumerate(bodies)],
            batch_size=2000,
        )
        # Conditional: a batch cancelled while it was validated stays cancelling (the dispatcher ends it).
        Batch.objects.filter(pk=batch.pk).update(total=len(bodies), model=bodies[0][1]["model"])
        Batch.objects.filter(pk=batch.pk, status=Batch.Status.VALIDATING).update(
            status=Batch.Status.IN_PROGRESS, in_progress_at=timezone.now()
        )
    batch.refresh_from_db()
    record_event("batch.created", batch, actor=batch.owner, data={"requests": len(bodies), "endpoint": endpoint})
    return batch


class BatchInvalid(Exception):
    def __init__(self, errors: list[dict]):
        super().__init__(f"{len(errors)} invalid lines")
        self.errors = errors


def owned_batch(owner_id: int, batch_id: str) -> Batch:
    b = Batch.objects.filter(pk=clean_id(batch_id), owner_id=owner_id).first()
    if b is None:
        raise GatewayError(404, f"No such Batch object: {clean_id(batch_id)}", "batch_id", "not_found")
    return b


def cancel_batch(b: Batch) -> Batch:
    """In progress (or validating): cancelling, then the dispatcher stops sending within a
    second and ends it as cancelled. Any other status: a 409 saying which."""
    changed = Batch.objects.filter(pk=b.pk, status__in=(Batch.Status.IN_PROGRESS, Batch.Status.VALIDATING)).update(
        status=Batch.Status.CANCELLING, cancelling_at=timezone.now()
    )
    b.refresh_from_db()
    if not changed and b.status not in (Batch.Status.CANCELLING, Batch.Status.CANCELLED):
        message = f"Batch '{b.id}' is {b.status}: it can no longer be cancelled."
        raise GatewayError(409, message, code="batch_not_active")
    return b


# -- lines' results (the dispatcher's) -------------------------------------------------------------
def line_result(
    line: BatchLine, status: int | None, body: dict | None, request_id: str | None, error: dict | None = None
) -> dict:
    """An output file line, OpenAI's shape."""
    response = None if status is None else {"status_code": status, "request_id": request_id or "", "body": body}
    return {
        "id": f"batch_req_{line.batch_id.removeprefix('batch_')}_{line.index}",
        "custom_id": line.custom_id,
        "response": response,
        "error": error,
    }


def write_result(line: BatchLine, token: str, attempt: int, ok: bool, result: dict) -> bool:
    """Record the line's result, once: only if it is still the attempt `token` sent. The batch's
    counts move in the same transaction. False: someone else holds it now (nothing written)."""
    with transaction.atomic():
        done = BatchLine.objects.filter(pk=line.pk, state=BatchLine.State.SENT, sent_by=token, attempts=attempt).update(
            state=BatchLine.State.DONE, ok=ok, result=result
        )
        if done:
            field = "completed" if ok else "failed"
            Batch.objects.filter(pk=line.batch_id).update(**{field: F(field) + 1})
    return bool(done)


def end_unanswered(batch: Batch, code: str, message: str) -> None:
    """Every line not answered yet gets an error line (`batch_expired`, `batch_cancelled`)."""
    lines = BatchLine.objects.filter(batch=batch).exclude(state=BatchLine.State.DONE)
    for line in lines.iterator(chunk_size=2000):
        result = line_result(line, None, None, None, {"code": code, "message": message})
        with transaction.atomic():
            if (
                BatchLine.objects.filter(pk=line.pk)
                .exclude(state=BatchLine.State.DONE)
                .update(state=BatchLine.State.DONE, ok=False, result=result)
            ):
                Batch.objects.filter(pk=batch.pk).update(failed=F("failed") + 1)


def finalize(batch: Batch, final: str) -> None:
    """Name the output and error files (rendered from the lines) and end the batch as `final`."""
    now = timezone.now()
    if final == Batch.Status.COMPLETED:  # every line answered: finalizing while the files are named
        Batch.objects.filter(pk=batch.pk, finalizing_at__isnull=True).update(
            status=Batch.Status.FINALIZING, finalizing_at=now
        )
    batch.refresh_from_db()
    with transaction.atomic():  # the files and the end together: a dispatcher that dies here leaves neither
        batch = Batch.objects.select_for_update().get(pk=batch.pk)  # two finalizers: the second sees the end
        if batch.status in (Batch.Status.COMPLETED, Batch.Status.EXPIRED, Batch.Status.CANCELLED):
            return
        _name_files(batch, final, now)
    batch.refresh_from_db()
    record_event(
        f"batch.{final}", batch, data={"total": batch.total, "completed": batch.completed, "failed": batch.failed}
    )


def _name_files(batch: Batch, final: str, now) -> None:
    files = {}
    for errors_only in (False, True):
        lines = BatchLine.objects.filter(batch=batch, state=BatchLine.State.DONE, ok=not errors_only)
        count = lines.count()
        if count:
            size = sum(len(json.dumps(r)) + 1 for r in lines.values_list("result", flat=True).iterator(chunk_size=2000))
            name = f"{batch.id}_{'error' if errors_only else 'output'}.jsonl"
            files[errors_only] = BatchFile.objects.create(
                id=new_id("file-"), owner_id=batch.owner_id, purpose=BatchFile.Purpose.BATCH_OUTPUT, filename=name,
                bytes=size, lines=count, batch=batch, errors_only=errors_only,
            )  # fmt: skip
    stamp = {"completed": "completed_at", "expired": "expired_at", "cancelled": "cancelled_at"}[final]
    Batch.objects.filter(pk=batch.pk).update(
        status=final,
        output_file=files.get(False),
        error_file=files.get(True),
        lease_owner="",
        lease_until=None,
        **{stamp: now},
    )
