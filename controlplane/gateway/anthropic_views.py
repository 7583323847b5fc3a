"""Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.

The key comes as `x-api-key` (or `Authorization: Bearer`); `anthropic-version` is accepted
whatever it says (one wire format is served) and `anthropic-beta` too: what a beta would
enable arrives as body parameters, which are refused when not built. The request runs as a
chat (anthropic_request.py) and answers with content blocks (`text`, `tool_use`), whole or as
Anthropic's event stream; errors come in Anthropic's shape.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

import redis
from django.http import JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from controlplane.gateway import generation, tokenization
from controlplane.gateway.anthropic_request import MessagesRequest, error_body, parse_count_tokens, parse_messages
from controlplane.gateway.core.body import read_json
from controlplane.gateway.core.errors import GatewayError
from controlplane.gateway.openai_views import _deltas, _headers
from controlplane.gateway.output_items import Called, Closed, Grew, Opened, OutputItems, Text
from controlplane.gateway.tool_calls import CLOSE, OPEN, ToolCall
from workers.protocol.replica import DeltaEvent

log = logging.getLogger(__name__)


def error_response(exc: GatewayError) -> JsonResponse:
    response = JsonResponse(error_body(exc), status=exc.status)
    for name, value in exc.headers.items():
        response[name] = value
    return response


def anthropic_view(view):
    """POST only, and every refusal in Anthropic's error shape."""

    async def handler(request, *args, **kwargs):
        if request.method != "POST":
            return error_response(GatewayError(405, f"Use POST on {request.path}."))
        try:
            return await view(request, *args, **kwargs)
        except GatewayError as exc:
            return error_response(exc)
        except redis.RedisError as exc:
            log.exception("Redis failed under %s", request.path)
            return error_response(generation.broker_unavailable(exc))

    handler.__name__ = view.__name__
    handler.__doc__ = view.__doc__
    return csrf_exempt(handler)


async def _caller(request) -> generation.Caller:
    secret = request.headers.get("x-api-key") or generation.secret_from_header(request.headers.get("Authorization"))
    if not secret:
        raise GatewayError(401, "Missing API key: send it as 'x-api-key: sy-...' (or 'Authorization: Bearer sy-...').")
    return await generation.caller_from_secret(secret)


def tool_input(call: ToolCall) -> dict | None:
    """A call's arguments as the object a `tool_use` block holds; None when they are not one."""
    try:
        value = json.loads(call.arguments)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def stop_reason(event: DeltaEvent, tool_use: bool) -> tuple[str, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for the engine's finish."""
    if event.finish_reason == "length":
        return "max_tokens", None
    if tool_use:
        return "tool_use", None
    if isinstance(event.stop_reason, str):
        return "stop_sequence", event.stop_reason
    return "end_turn", None


def usage(event: DeltaEvent | None, prompt_tokens: int = 0) -> dict:
    """input_tokens counts what was not read from the cache, as Anthropic's does."""
    u = (event.usage if event is not None else None) or {}
    prompt, cached = u.get("prompt_tokens", prompt_tokens), u.get("cached_tokens", 0)
    return {"input_tokens": prompt - cached, "output_tokens": u.get("completion_tokens", 0),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}  # fmt: skip


class MessageBuilder:
    """The message of one request and the stream events that build it."""

    def __init__(self, parsed: MessagesRequest):
        self.parsed = parsed
        self.id = f"msg_{uuid.uuid4().hex}"
        self.items = OutputItems(parsed.req)
        self.blocks: list[dict] = []

    def _block(self, item: Text | ToolCall) -> dict:
        if isinstance(item, Text):
            return {"type": "text", "text": item.text}
        arguments = tool_input(item)
        if arguments is None:  # not an object: shown as the model wrote it
            return {"type": "text", "text": f"{OPEN}{json.dumps({'name': item.name, 'arguments': item.arguments})}"
                    f"{CLOSE}"}  # fmt: skip
        return {"type": "tool_use", "id": "toolu_" + item.id.removeprefix("call_"), "name": item.name,
                "input": arguments}  # fmt: skip

    def message(self, last: DeltaEvent | None) -> dict:
        content = [self._block(item) for item in self.items.items] if last is not None else []
        tool_use = any(b["type"] == "tool_use" for b in content)
        reason, sequence = stop_reason(last, tool_use) if last is not None else (None, None)
        prompt = len(self.parsed.req.prompt_token_ids or [])
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.parsed.model,
                "content": content, "stop_reason": reason, "stop_sequence": sequence,
                "usage": usage(last, prompt)}  # fmt: skip

    def start(self) -> list[tuple[str, dict]]:
        return [("message_start", {"type": "message_start", "message": self.message(None)}), ("ping", {"type": "ping"})]

    def feed(self, delta: DeltaEvent) -> list[tuple[str, dict]]:
        out: list[tuple[str, dict]] = []
        for change in self.items.feed(delta):
            if isinstance(change, Opened):
                out.append(("content_block_start", {"type": "content_block_start", "index": change.index,
                                                    "content_block": {"type": "text", "text": ""}}))  # fmt: skip
            elif isinstance(change, Grew):
                out.append(("content_block_delta", {"type": "content_block_delta", "index": change.index,
                                                    "delta": {"type": "text_delta", "text": change.text}}))  # fmt: skip
            elif isinstance(change, Closed):
                out.append(("content_block_stop", {"type": "content_block_stop", "index": change.index}))
            elif isinstance(change, Called):
                block = self._block(change.call)
                if block["type"] == "tool_use":
                    delta_body = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                    block = {**block, "input": {}}
                else:
                    delta_body, block = {"type": "text_delta", "text": block["text"]}, {"type": "text", "text": ""}
                out += [("content_block_start", {"type": "content_block_start", "index": change.index,
                                                 "content_block": block}),
                        ("content_block_delta", {"type": "content_block_delta", "index": change.index,
                                                 "delta": delta_body}),
                        ("content_block_stop", {"type": "content_block_stop", "index": change.index})]  # fmt: skip
        if delta.final:
            message = self.message(delta)
            out += [("message_delta", {"type": "message_delta", "usage": message["usage"],
                                       "delta": {"stop_reason": message["stop_reason"],
                                                 "stop_sequence": message["stop_sequence"]}}),
                    ("message_stop", {"type": "message_stop"})]  # fmt: skip
        return out


def sse_event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


@anthropic_view
async def messages(request):
    caller = await _caller(request)  # 401 before looking at the body
    parsed = parse_messages(read_json(request))
    gen = await generation.start(parsed.req, caller, request.headers)
    builder = MessageBuilder(parsed)
    if parsed.stream:
        response = StreamingHttpResponse(_stream(builder, gen), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
    else:
        deltas = await _deltas(gen)
        for delta in deltas:
            builder.items.feed(delta)
        response = JsonResponse(builder.message(deltas[-1]))
    for name, value in _headers(gen).items():
        response[name] = value
    return response


async def _stream(builder: MessageBuilder, gen: generation.Generation):
    """Anthropic's event stream; a request that fails mid-stream ends with an `error` event.
    The request is closed (aborted if still running) either way."""
    try:
        for name, data in builder.start():
            yield sse_event(name, data)
        try:
            async for delta in gen.events():
                for name, data in builder.feed(delta):
                    yield sse_event(name, data)
        except GatewayError as exc:
            yield sse_event("error", error_body(exc))
    finally:
        await gen.close()


@anthropic_view
async def count_tokens(request):
    """The prompt's tokens, as the deployment's replicas would run it (the chat template with its
    tools): `{"input_tokens": n}`. Nothing is generated, so no rate limit applies."""
    caller = await _caller(request)
    parsed = parse_count_tokens(read_json(request))
    deployment = await generation.resolve_deployment(parsed.model, caller)
    ids = await asyncio.to_thread(tokenization.prompt_ids, deployment, parsed.req)
    if ids is None:  # a hub model, or a directory this web process does not see
        raise GatewayError(501, f"Tokens cannot be counted for '{parsed.model}': the gateway cannot read its "
                          "tokenizer (the replicas tokenise its requests).")  # fmt: skip
    return JsonResponse({"input_tokens": len(ids)})
