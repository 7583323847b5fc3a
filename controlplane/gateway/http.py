"""HTTP for every dialect: the view decorator, Server-Sent Events, answering whole or streamed,
and the route headers and notes the gateway adds to an answer.

Plain async Django views (DRF is synchronous): admission happens in generation.start, a dialect
only shapes events into its JSON. If the client disconnects, Django cancels the view or the
stream; `Generation.events` then aborts the request in the replica.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable

import redis
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from controlplane.gateway import generation
from controlplane.gateway.core import GatewayError
from workers.protocol.replica import DeltaEvent

log = logging.getLogger(__name__)

Render = Callable[[GatewayError], dict]  # an error as a dialect's body; GatewayError.body is OpenAI's


def error_response(exc: GatewayError, render: Render = GatewayError.body) -> JsonResponse:
    response = JsonResponse(render(exc), status=exc.status)
    for name, value in exc.headers.items():
        response[name] = value
    return response


def api_view(methods: tuple[str, ...] = ("POST",), render: Render = GatewayError.body):
    """Method check, errors in the dialect's shape (`render`), and nothing escapes as a 500 for
    bad input."""

    def wrap(view):
        async def handler(request, *args, **kwargs):
            if request.method not in methods:
                return error_response(
                    GatewayError(405, f"Use {' or '.join(methods)} on {request.path}.", code="method_not_allowed"),
                    render,
                )
            try:
                return await view(request, *args, **kwargs)
            except GatewayError as exc:
                return error_response(exc, render)
            except redis.RedisError as exc:
                log.exception("Redis failed under %s", request.path)
                return error_response(generation.broker_unavailable(exc), render)

        handler.__name__ = view.__name__
        handler.__doc__ = view.__doc__
        return csrf_exempt(handler)

    return wrap


async def bearer_caller(request) -> generation.Caller:
    """The caller of `Authorization: Bearer <key>`."""
    return await generation.caller_from_secret(generation.secret_from_header(request.headers.get("Authorization")))


def sse(data: dict | str, event: str | None = None) -> bytes:
    """One Server-Sent Event (`event`: its name, for APIs that name them)."""
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


async def deltas(gen: generation.Generation) -> list[DeltaEvent]:
    """Every delta event of a request that is answered in one response."""
    try:
        return [event async for event in gen.events()]
    finally:
        await gen.close()


def respond(
    gen: generation.Generation,
    body: dict | None,
    events: AsyncIterator[bytes] | None = None,
    failed: Callable[[GatewayError], bytes] | None = None,
    end: bytes = b"",
) -> HttpResponse:
    """JSON `body`, or (when there is none: the request streams) the `events`, then `end`; then
    the route headers. A request that fails mid-stream ends with `failed(error)` (then `end`);
    the request is closed (aborted if still running) either way."""
    if body is None:
        response = StreamingHttpResponse(_stream(gen, events, failed, end), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
    else:
        response = JsonResponse(body)
    for name, value in route_headers(gen).items():
        response[name] = value
    return response


async def _stream(gen, events, failed, end):
    try:
        try:
            async for chunk in events:
                yield chunk
        except GatewayError as exc:
            yield failed(exc)
        if end:
            yield end
    finally:
        await gen.close()


def route_headers(gen: generation.Generation) -> dict:
    headers = {
        "x-request-id": gen.request_id,
        "x-switchyard-replica": str(gen.route.replica_id),
        "x-switchyard-route-reason": gen.route.reason,
    }
    if gen.route.predicted_cached_tokens is not None:  # the gateway had the prompt's token ids
        headers["x-switchyard-cached-tokens-predicted"] = str(gen.route.predicted_cached_tokens)
    if gen.prefill_replica is not None:  # only when a prefill replica computes the prompt
        headers["x-switchyard-prefill-replica"] = str(gen.prefill_replica)
    return headers


def prefill_note(gen: generation.Generation, body: dict) -> dict:
    """The last chunk of a stream on a disaggregated deployment says which prefill replica
    computed the prompt (None: the decode replica did). The header went out before the prompt
    was computed: it names the replica the prompt was handed to, which a fallback can undo."""
    if gen.deployment.mode == "disaggregated":
        body.setdefault("x_switchyard", {})["prefill_replica"] = gen.prefill_replica
    return resume_note(gen, body)


def resume_note(gen: generation.Generation, body: dict) -> dict:
    """The last chunk (or the JSON answer) of a request that moved to another replica lists
    each move: {"from_replica", "to_replica", "after_tokens"} (see failover.py)."""
    if gen.resumed:
        body.setdefault("x_switchyard", {})["resumed"] = gen.resumed
    return body
