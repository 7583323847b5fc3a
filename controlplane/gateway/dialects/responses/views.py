"""OpenAI's Responses API: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`.

A response runs as a chat (request.py) and answers with output items (a `message` of
`output_text`, a `function_call` per tool call; output_items.py), whole or as the Responses
stream events, each with its `sequence_number`. Unless `store` is false the answer is kept
(models.StoredResponse, visible to the API key's owner only) so that `previous_response_id` can
continue the conversation.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

from asgiref.sync import sync_to_async
from django.http import JsonResponse

from controlplane.gateway import generation
from controlplane.gateway.core import GatewayError, GenerationRequest, bad, counts, naming, read_json
from controlplane.gateway.dialects.responses.request import MAX_ID, NAMES, ResponsesRequest, parse_responses
from controlplane.gateway.http import api_view, bearer_caller, deltas, prefill_note, respond, sse
from controlplane.gateway.models import StoredResponse
from controlplane.gateway.output_items import Called, Closed, Grew, Opened, OutputItems, Text
from workers.protocol.replica import DeltaEvent


def _hex() -> str:
    return uuid.uuid4().hex


class ResponseBuilder:
    """The response object of one request and the stream events that build it."""

    def __init__(self, parsed: ResponsesRequest, req: GenerationRequest, created: int, history: list[dict],
                 note: Callable[[dict], dict] = lambda body: body):  # fmt: skip
        self.parsed = parsed
        self.created = created
        self.history = history
        self.note = note  # what the gateway adds to a finished response (x_switchyard)
        self.id = f"resp_{_hex()}"
        self.items = OutputItems(req)
        self.output: list[dict] = []
        self.sequence = 0
        self.last: DeltaEvent | None = None

    def event(self, kind: str, **fields) -> dict:
        out = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return out

    def response(self, status: str | None = None, error: dict | None = None) -> dict:
        """The response object: in progress, or (after the final delta) as it ended."""
        p, last = self.parsed, self.last
        if status is None:
            status = "incomplete" if last is not None and last.finish_reason == "length" else "completed"
        body = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": p.instructions, "max_output_tokens": p.max_output_tokens, "model": p.model,
            "output": json.loads(json.dumps(self.output)), "parallel_tool_calls": True,
            "previous_response_id": p.previous_response_id, "reasoning": None, "store": p.store,
            "temperature": 1.0 if p.temperature is None else p.temperature, "text": {"format": p.text_format},
            "tool_choice": p.tool_choice, "tools": p.tools, "top_p": 1.0 if p.top_p is None else p.top_p,
            "truncation": "disabled", "usage": None, "user": p.user, "metadata": p.metadata, "background": False,
            "service_tier": "default" if p.chat.get("service_tier", "auto") == "auto" else p.chat["service_tier"],
        }  # fmt: skip
        if status in ("completed", "incomplete") and last is not None:
            body["usage"] = usage(last)
            self.note(body)
        return body

    def start(self) -> list[dict]:
        return [
            self.event("response.created", response=self.response("in_progress")),
            self.event("response.in_progress", response=self.response("in_progress")),
        ]

    def feed(self, delta: DeltaEvent) -> list[dict]:
        """The stream events `delta` makes; the final one ends with `response.completed` (or
        `response.incomplete`)."""
        out = []
        for change in self.items.feed(delta):
            if isinstance(change, Opened):
                out += self._opened(change)
            elif isinstance(change, Grew):
                out += self._grew(change)
            elif isinstance(change, Closed):
                out += self._closed(change)
            else:
                out += self._called(change)
        if delta.final:
            self.last = delta
            response = self.response()
            out.append(self.event(f"response.{response['status']}", response=response))
        return out

    def _opened(self, change: Opened) -> list[dict]:
        item = {"id": f"msg_{_hex()}", "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        self.output.append(item)
        where = {"item_id": item["id"], "output_index": change.index}
        return [
            self.event("response.output_item.added", output_index=change.index, item=dict(item)),
            self.event("response.content_part.added", **where, content_index=0, part=_text_part("")),
        ]

    def _grew(self, change: Grew) -> list[dict]:
        where = {"item_id": self.output[change.index]["id"], "output_index": change.index, "content_index": 0}
        return [self.event("response.output_text.delta", **where, delta=change.text, logprobs=[])]

    def _closed(self, change: Closed) -> list[dict]:
        item = self.output[change.index]
        text = self.items.items[change.index].text
        item["content"], item["status"] = [_text_part(text)], "completed"
        where = {"item_id": item["id"], "output_index": change.index, "content_index": 0}
        return [
            self.event("response.output_text.done", **where, text=text, logprobs=[]),
            self.event("response.content_part.done", **where, part=_text_part(text)),
            self.event("response.output_item.done", output_index=change.index, item=item),
        ]

    def _called(self, change: Called) -> list[dict]:
        call = change.call
        item = {"id": f"fc_{_hex()}", "type": "function_call", "status": "in_progress", "call_id": call.id,
                "name": call.name, "arguments": ""}  # fmt: skip
        self.output.append(item)
        where = {"item_id": item["id"], "output_index": change.index}
        added = self.event("response.output_item.added", output_index=change.index, item=dict(item))
        delta = self.event("response.function_call_arguments.delta", **where, delta=call.arguments)
        item["arguments"], item["status"] = call.arguments, "completed"
        done = self.event("response.function_call_arguments.done", **where, name=call.name, arguments=call.arguments)
        return [added, delta, done, self.event("response.output_item.done", output_index=change.index, item=item)]

    def conversation(self) -> list[dict]:
        """The chat messages a continuation of this response starts with."""
        texts = [item.text for item in self.items.items if isinstance(item, Text)]
        calls = self.items.calls
        answer = {"role": "assistant", "content": "".join(texts).strip() if calls else "".join(texts)}
        if calls:
            answer["tool_calls"] = [c.as_openai() for c in calls]
        return [*self.history, *self.parsed.input_messages, answer]


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def usage(event: DeltaEvent) -> dict:
    n = counts([event])
    return {
        "input_tokens": n.prompt,
        "input_tokens_details": {"cached_tokens": n.cached},
        "output_tokens": n.completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": n.prompt + n.completion,
    }


# -- stored responses ----------------------------------------------------------------------------
def _owner(caller: generation.Caller) -> int | None:
    return caller.key.owner_id if caller.key is not None else None


@sync_to_async
def _history(rid: str, caller: generation.Caller) -> list[dict]:
    row = StoredResponse.objects.filter(pk=rid, owner_id=_owner(caller)).only("conversation").first()
    if row is None:  # never stored (store: false), deleted, or another owner's: the same answer
        raise bad(
            f"Previous response with id '{rid}' not found.", "previous_response_id", "previous_response_not_found"
        )
    return row.conversation


@sync_to_async
def _store(builder: ResponseBuilder, caller: generation.Caller, body: dict) -> None:
    StoredResponse.objects.create(
        id=builder.id, owner_id=_owner(caller), api_key=caller.key, conversation=builder.conversation(), response=body
    )


@sync_to_async
def _stored(rid: str, caller: generation.Caller) -> StoredResponse:
    ok = rid.startswith("resp_") and len(rid) <= MAX_ID and "\x00" not in rid  # else no response's (nor a valid query)
    row = StoredResponse.objects.filter(pk=rid, owner_id=_owner(caller)).first() if ok else None
    if row is None:
        raise GatewayError(404, f"No response with id '{rid}' found.", "response_id", "not_found")
    return row


@sync_to_async
def _delete(row: StoredResponse) -> None:
    row.delete()


# -- views -----------------------------------------------------------------------------------------
@api_view(("POST",))
async def create_response(request):
    caller = await bearer_caller(request)  # 401 before looking at the body
    parsed = parse_responses(read_json(request))
    history = await _history(parsed.previous_response_id, caller) if parsed.previous_response_id else []
    with naming(NAMES):  # admission's errors too name this API's parameters
        req = parsed.generation_request(history)
        gen = await generation.start(req, caller, request.headers)
    builder = ResponseBuilder(parsed, req, gen.created, history, note=lambda body: prefill_note(gen, body))
    if parsed.stream:
        return respond(gen, None, _events(builder, gen), lambda exc: _event(_failed(builder, exc)))
    builder.start()
    for delta in await deltas(gen):
        builder.feed(delta)
    body = builder.response()
    if parsed.store:
        await _store(builder, caller, body)
    return respond(gen, body)


def _event(event: dict) -> bytes:
    return sse(event, event["type"])


async def _events(builder: ResponseBuilder, gen: generation.Generation):
    """The Responses stream events (a failure mid-stream ends it with `response.failed`)."""
    for event in builder.start():
        yield _event(event)
    async for delta in gen.events():
        events = builder.feed(delta)
        if delta.final and builder.parsed.store:  # stored before the client hears it is done
            await _store(builder, gen.caller, events[-1]["response"])
        for event in events:
            yield _event(event)


def _failed(builder: ResponseBuilder, exc: GatewayError) -> dict:
    error = {"code": exc.code or exc.type, "message": exc.message}
    return builder.event("response.failed", response=builder.response("failed", error))


@api_view(("GET", "DELETE"))
async def response_detail(request, rid: str):
    caller = await bearer_caller(request)
    if request.GET:
        name = next(iter(request.GET))
        raise bad(f"'{name}' is not supported on this endpoint.", name, "unsupported")
    row = await _stored(rid, caller)
    if request.method == "DELETE":
        await _delete(row)
        return JsonResponse({"id": row.pk, "object": "response", "deleted": True})
    return JsonResponse(row.response)
