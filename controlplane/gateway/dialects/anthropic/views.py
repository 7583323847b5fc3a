"""Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.

The key comes as `x-api-key` (or `Authorization: Bearer`); `anthropic-version` is accepted
whatever it says (one wire format is served) and `anthropic-beta` too: what a beta would
enable arrives as body parameters, which are refused when not built. The request runs as a
chat (request.py) and answers with content blocks (`text`, `tool_use`), whole or as
Anthropic's event stream; errors come in Anthropic's shape.
"""

from __future__ import annotations

import asyncio
import json
import uuid

from django.http import JsonResponse

from controlplane.gateway import generation, tokenization
from controlplane.gateway.core import GatewayError, TokenCounts, counts, read_json
from controlplane.gateway.dialects.anthropic.request import (
    MessagesRequest,
    error_body,
    parse_count_tokens,
    parse_messages,
)
from controlplane.gateway.http import api_view, deltas, respond, sse
from controlplane.gateway.output_items import Called, Closed, Grew, Opened, OutputItems, Text
from controlplane.gateway.tool_calls import CLOSE, OPEN, ToolCall
from workers.protocol.replica import DeltaEvent

VIEW = api_view(("POST",), render=error_body)  # every refusal in Anthropic's error shape


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


def usage(n: TokenCounts) -> dict:
    """input_tokens counts what was not read from the cache, as Anthropic's does."""
    return {
        "input_tokens": n.prompt - n.cached,
        "output_tokens": n.completion,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": n.cached,
    }


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
            return {
                "type": "text",
                "text": f"{OPEN}{json.dumps({'name': item.name, 'arguments': item.arguments})}{CLOSE}",
            }
        return {
            "type": "tool_use",
            "id": "toolu_" + item.id.removeprefix("call_"),
            "name": item.name,
            "input": arguments,
        }

    def message(self, last: DeltaEvent | None) -> dict:
        content = [self._block(item) for item in self.items.items] if last is not None else []
        tool_use = any(b["type"] == "tool_use" for b in content)
        reason, sequence = stop_reason(last, tool_use) if last is not None else (None, None)
        used = counts([last]) if last is not None else TokenCounts(len(self.parsed.req.prompt_token_ids or []), 0)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.parsed.model,
                "content": content, "stop_reason": reason, "stop_sequence": sequence,
                "usage": usage(used)}  # fmt: skip

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


@VIEW
async def messages(request):
    caller = await _caller(request)  # 401 before looking at the body
    parsed = parse_messages(read_json(request))
    gen = await generation.start(parsed.req, caller, request.headers)
    builder = MessageBuilder(parsed)
    if parsed.stream:
        return respond(gen, None, _events(builder, gen), lambda exc: sse(error_body(exc), "error"))
    events = await deltas(gen)
    for delta in events:
        builder.items.feed(delta)
    return respond(gen, builder.message(events[-1]))


async def _events(builder: MessageBuilder, gen: generation.Generation):
    """Anthropic's event stream (a failure mid-stream ends it with an `error` event)."""
    for name, data in builder.start():
        yield sse(data, name)
    async for delta in gen.events():
        for name, data in builder.feed(delta):
            yield sse(data, name)


@VIEW
async def count_tokens(request):
    """The prompt's tokens, as the deployment's replicas would run it (the chat template with its
    tools): `{"input_tokens": n}`. Nothing is generated, so no rate limit applies."""
    caller = await _caller(request)
    parsed = parse_count_tokens(read_json(request))
    deployment = await generation.resolve_deployment(parsed.model, caller)
    ids = await asyncio.to_thread(tokenization.prompt_ids, deployment, parsed.req)
    if ids is None:  # a hub model, or a directory this web process does not see
        raise GatewayError(
            501,
            f"Tokens cannot be counted for '{parsed.model}': the gateway cannot read its "
            "tokenizer (the replicas tokenise its requests).",
        )
    return JsonResponse({"input_tokens": len(ids)})
