"""A request's JSON body, within the request limits (common.json_body), as a dict."""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig

from controlplane.common import json_body
from controlplane.gateway.core.errors import GatewayError, bad


def parse_json(raw: bytes | str) -> dict:
    """Size over the limit 413; depth, NaN/Infinity, not an object 400."""
    try:
        body = json_body.load(raw or b"")
    except json_body.BodyError as exc:
        raise _error(exc) from None
    if not isinstance(body, dict):
        raise bad("The request body must be a JSON object.", code="invalid_json")
    return body


def read_json(request) -> dict:
    try:
        raw = request.body
    except RequestDataTooBig:  # over MAX_REQUEST_BYTES (the ASGI handler refuses most before)
        raise too_large() from None
    return parse_json(raw)


def too_large(size: int | None = None) -> GatewayError:
    """The 413 of a body over MAX_REQUEST_BYTES (`size`: its length, when known)."""
    return _error(json_body.too_large(size))


def _error(exc: json_body.BodyError) -> GatewayError:
    return GatewayError(exc.status, exc.message, exc.param, exc.code)
