"""/v1/files and /v1/batches: OpenAI's Files (purpose `batch`) and Batch endpoints, scoped to
the API key's owner (another owner's file or batch is a 404, as one that does not exist)."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpResponse, JsonResponse

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchFile
from controlplane.batches.validation import validate
from controlplane.gateway import generation
from controlplane.gateway.core import GatewayError, bad, read_json
from controlplane.gateway.http import api_view, bearer_caller

MAX_PAGE = 100


async def _caller(request) -> generation.Caller:
    caller = await bearer_caller(request)
    if caller.batch is not None:  # a batch's own lines do not manage batches
        raise GatewayError(403, "A batch token may only run its batch's requests.", code="forbidden")
    return caller


def _page(request, rows, shape, default: int) -> dict:
    """OpenAI's cursor pages: `limit` (1-100) objects after the id `after`, newest first."""
    raw, most = request.GET.get("limit", str(default)), max(MAX_PAGE, default)
    if not (raw.isascii() and raw.isdecimal() and len(raw) <= 6 and 1 <= int(raw) <= most):
        raise bad(f"'limit' must be an integer between 1 and {most}.", "limit")
    after = request.GET.get("after")
    if after:
        anchor = rows.filter(pk=services.clean_id(after)).first()
        if anchor is None:
            raise bad(f"'after' names no object of this list: {after[:60]}", "after")
        rows = rows.filter(created_at__lte=anchor.created_at).exclude(pk=anchor.pk)
        rows = rows.exclude(created_at=anchor.created_at, pk__gt=anchor.pk)
    items = list(rows[: int(raw) + 1])
    data = [shape(item) for item in items[: int(raw)]]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(items) > int(raw),
    }


# -- files -----------------------------------------------------------------------------------------
@api_view(("GET", "POST"))
async def files(request):
    caller = await _caller(request)
    if request.method == "POST":
        return JsonResponse(await sync_to_async(_upload)(request, caller))
    return JsonResponse(await sync_to_async(_files)(request, caller))


def _upload(request, caller) -> dict:
    if not request.content_type.startswith("multipart/form-data"):
        message = "Upload the file as multipart/form-data with the fields 'file' and 'purpose'."
        raise bad(message, "file", "invalid_type")
    upload = request.FILES.get("file")
    if upload is None:
        raise bad("'file' is required: the JSONL file of requests.", "file", "missing")
    purpose = request.POST.get("purpose")
    if not purpose:
        raise bad("'purpose' is required ('batch').", "purpose", "missing")
    f = services.create_file(caller.key.owner, upload.name or "", purpose, upload.chunks())
    return services.file_object(f)


def _files(request, caller) -> dict:
    rows = BatchFile.objects.filter(owner_id=caller.key.owner_id, deleted=False)
    purpose = request.GET.get("purpose")
    if purpose:
        rows = rows.filter(purpose=purpose)
    return _page(request, rows, services.file_object, 10_000)


@api_view(("GET", "DELETE"))
async def file_detail(request, file_id: str):
    caller = await _caller(request)
    return JsonResponse(await sync_to_async(_file_detail)(request.method, caller, file_id))


def _file_detail(method: str, caller, file_id: str) -> dict:
    f = services.owned_file(caller.key.owner_id, file_id)
    if method == "DELETE":
        services.delete_file(f)
        return {"id": f.id, "object": "file", "deleted": True}
    return services.file_object(f)


@api_view(("GET",))
async def file_content(request, file_id: str):
    caller = await _caller(request)
    data = await sync_to_async(_content)(caller, file_id)
    return HttpResponse(data, content_type="application/jsonl")


def _content(caller, file_id: str) -> bytes:
    f = services.owned_file(caller.key.owner_id, file_id)
    try:
        return b"".join(services.file_content(f))
    except FileNotFoundError:
        message = f"The content of file {f.id} is gone from the file storage."
        raise GatewayError(404, message, code="not_found") from None


# -- batches ---------------------------------------------------------------------------------------
@api_view(("GET", "POST"))
async def batches(request):
    caller = await _caller(request)
    if request.method == "POST":
        body = read_json(request)
        return JsonResponse(await sync_to_async(_create)(caller, body))
    return JsonResponse(await sync_to_async(_batches)(request, caller))


def _create(caller, body: dict) -> dict:
    return services.batch_object(services.create_batch(caller, body, validate))


def _batches(request, caller) -> dict:
    return _page(request, Batch.objects.filter(owner_id=caller.key.owner_id), services.batch_object, 20)


@api_view(("GET",))
async def batch_detail(request, batch_id: str):
    caller = await _caller(request)
    return JsonResponse(await sync_to_async(_batch)(caller, batch_id))


def _batch(caller, batch_id: str) -> dict:
    return services.batch_object(services.owned_batch(caller.key.owner_id, batch_id))


@api_view(("POST",))
async def batch_cancel(request, batch_id: str):
    caller = await _caller(request)
    return JsonResponse(await sync_to_async(_cancel)(caller, batch_id))


def _cancel(caller, batch_id: str) -> dict:
    return services.batch_object(services.cancel_batch(services.owned_batch(caller.key.owner_id, batch_id)))
