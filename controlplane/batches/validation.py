"""A batch's lines checked before any is sent: each is `{"custom_id", "method": "POST", "url",
"body"}` with a unique custom_id, the batch's endpoint as its url, and a body its endpoint's own
parser accepts (the same checks and messages as a request sent alone), all naming one model the
key may use. The first MAX_ERRORS problems fail the batch, each with its line number."""

from __future__ import annotations

import json

from controlplane.batches.services import MAX_ERRORS, BatchInvalid
from controlplane.gateway import generation
from controlplane.gateway.core import GatewayError
from controlplane.gateway.dialects.openai.request import parse_chat, parse_completion
from controlplane.gateway.dialects.responses.request import parse_responses

PARSERS = {"/v1/chat/completions": parse_chat, "/v1/completions": parse_completion, "/v1/responses": parse_responses}
MAX_CUSTOM_ID = 512


class _LineError(Exception):
    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request"):
        super().__init__(message)
        self.param, self.code = param, code


def _line(text: str, endpoint: str, seen: set[str]) -> tuple[str, dict]:
    try:
        item = json.loads(text)
    except ValueError:
        raise _LineError("The line is not JSON.") from None
    if not isinstance(item, dict):
        raise _LineError("The line is not a JSON object.")
    unknown = sorted(set(item) - {"custom_id", "method", "url", "body"})
    if unknown:
        raise _LineError(f"Unrecognized field '{unknown[0]}'.", unknown[0])
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
        raise _LineError(f"'custom_id' must be a non-empty string of at most {MAX_CUSTOM_ID} characters.", "custom_id")
    if custom_id in seen:
        message = f"The custom_id '{custom_id[:60]}' is used on an earlier line."
        raise _LineError(message, "custom_id", "duplicate_custom_id")
    seen.add(custom_id)
    if item.get("method") != "POST":
        raise _LineError("'method' must be 'POST'.", "method")
    if item.get("url") != endpoint:
        raise _LineError(f"'url' must be the batch's endpoint, {endpoint}.", "url", "mismatched_endpoint")
    body = item.get("body")
    if not isinstance(body, dict):
        raise _LineError("'body' must be an object: the request as its endpoint takes it.", "body")
    if body.get("stream"):
        raise _LineError("'body.stream' must be false: batch answers are not streamed.", "body.stream")
    try:
        PARSERS[endpoint](body)
    except GatewayError as exc:
        raise _LineError(exc.message, f"body.{exc.param}" if exc.param else "body") from None
    return custom_id, body


def validate(lines: list[str], endpoint: str, caller: generation.Caller) -> list[tuple[str, dict]]:
    """Each line's (custom_id, body); BatchInvalid with the problems found, if any."""
    errors: list[dict] = []
    bodies: list[tuple[str, dict]] = []
    seen: set[str] = set()
    models: dict[str, int] = {}  # model -> first line naming it
    for number, text in enumerate(lines, 1):
        try:
            custom_id, body = _line(text, endpoint, seen)
        except _LineError as exc:
            errors.append({"code": exc.code, "message": str(exc), "param": exc.param, "line": number})
            if len(errors) >= MAX_ERRORS:
                break
            continue
        models.setdefault(body["model"], number)
        bodies.append((custom_id, body))
    if len(models) > 1:
        (first, _), (other, line) = list(models.items())[:2]
        message = f"Every line of a batch must name the same model: '{other}' here, '{first}' before."
        errors.append({"code": "mismatched_model", "param": "body.model", "line": line, "message": message})
    for model, line in list(models.items())[:1]:
        try:
            generation.resolve(model, caller)
        except GatewayError as exc:
            errors.append(
                {"code": exc.code or "invalid_model", "message": exc.message, "param": "body.model", "line": line}
            )
    if errors:
        raise BatchInvalid(errors)
    return bodies
