"""The OpenAI-compatible HTTP API: /v1/models, /v1/completions, /v1/chat/completions.

Plain async Django views (DRF is synchronous): admission happens in generation.start, these
views only shape events into OpenAI's JSON and Server-Sent Events. If the client disconnects,
Django cancels the view or the stream; `Generation.events` then aborts the request in the
replica.
"""

from __future__ import annotations

import json
import logging

import redis
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from controlplane.gateway import generation
from controlplane.gateway.core.body import read_json
from controlplane.gateway.core.errors import GatewayError
from controlplane.gateway.core.request import GenerationRequest
from controlplane.gateway.openai_request import parse_chat, parse_completion
from controlplane.gateway.tool_calls import ToolCall, ToolCallParser
from workers.protocol.replica import DeltaEvent, TokenLogprob

log = logging.getLogger(__name__)


def error_response(exc: GatewayError) -> JsonResponse:
    response = JsonResponse(exc.body(), status=exc.status)
    for name, value in exc.headers.items():
        response[name] = value
    return response


def openai_view(methods: tuple[str, ...]):
    """Method check, OpenAI-shaped errors, and nothing escapes as a 500 for bad input."""

    def wrap(view):
        async def handler(request, *args, **kwargs):
            if request.method not in methods:
                return error_response(GatewayError(405, f"Use {' or '.join(methods)} on {request.path}.",
                                                  code="method_not_allowed"))  # fmt: skip
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

    return wrap


async def _caller(request) -> generation.Caller:
    return await generation.caller_from_secret(generation.secret_from_header(request.headers.get("Authorization")))


def _headers(gen: generation.Generation) -> dict:
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


def _prefill_note(gen: generation.Generation, body: dict) -> dict:
    """The last chunk of a stream on a disaggregated deployment says which prefill replica
    computed the prompt (None: the decode replica did). The header went out before the prompt
    was computed: it names the replica the prompt was handed to, which a fallback can undo."""
    if gen.deployment.mode == "disaggregated":
        body.setdefault("x_switchyard", {})["prefill_replica"] = gen.prefill_replica
    return _resume_note(gen, body)


def _resume_note(gen: generation.Generation, body: dict) -> dict:
    """The last chunk (or the JSON answer) of a request that moved to another replica lists
    each move: {"from_replica", "to_replica", "after_tokens"} (see failover.py)."""
    if gen.resumed:
        body.setdefault("x_switchyard", {})["resumed"] = gen.resumed
    return body


def _usage(finals: list[DeltaEvent]) -> dict:
    """Usage from each choice's last delta (a stream ends with one per choice, or with an
    error): the prompt once, the completion tokens of every choice."""
    u = finals[0].usage or {}
    completion = sum((event.usage or {})["completion_tokens"] for event in finals)
    return {
        "prompt_tokens": u["prompt_tokens"],
        "completion_tokens": completion,
        "total_tokens": u["prompt_tokens"] + completion,
        "prompt_tokens_details": {"cached_tokens": u.get("cached_tokens", 0)},
    }


def _by_choice(events: list[DeltaEvent], n: int) -> list[list[DeltaEvent]]:
    """The events of each choice (`n` > 1: DeltaEvent.index), in order."""
    choices: list[list[DeltaEvent]] = [[] for _ in range(n)]
    for event in events:
        choices[event.index].append(event)
    return choices


def finish_reason(reason: str | None, tool_calls: bool) -> str | None:
    """OpenAI's finish_reason for the engine's: a stop that ended in tool calls is `tool_calls`."""
    if reason == "stop" and tool_calls:
        return "tool_calls"
    return {"abort": "stop"}.get(reason, reason)


def _chat_logprobs(entries: list[TokenLogprob]) -> list[dict]:
    def one(e):
        return {"token": e["token"], "logprob": e["logprob"], "bytes": list(e["token"].encode())}

    return [{**one(e), "top_logprobs": [one(t) for t in e["top"]]} for e in entries]


def _timing(req: GenerationRequest, body: dict, event: DeltaEvent | None) -> dict:
    """Opt-in (`x-switchyard-timing: 1`): when the replica produced this chunk's token(s), so a
    client can measure the delivery latency of the path (the gateway benchmark does)."""
    if req.timing and event is not None and event.t is not None:
        body.setdefault("x_switchyard", {})["replica_time"] = event.t
    return body


def _envelope(req: GenerationRequest, gen: generation.Generation, obj: str, choices: list) -> dict:
    return {"id": gen.request_id, "object": obj, "created": gen.created, "model": req.model, "choices": choices}


async def _deltas(gen: generation.Generation) -> list[DeltaEvent]:
    """Every delta event of a request that is answered in one response."""
    try:
        return [event async for event in gen.events()]
    finally:
        await gen.close()


async def _event_stream(gen: generation.Generation, chunks):
    """An SSE body: the chunks, then [DONE]. A request that fails mid-stream (its replica
    failed, or was lost with no other to resume on) ends with the error as an event, then
    [DONE]; the request is closed (aborted if still running) either way."""
    try:
        try:
            async for chunk in chunks:
                yield chunk
        except GatewayError as exc:
            yield sse(exc.body())
        yield sse("[DONE]")
    finally:
        await gen.close()


def _respond(gen: generation.Generation, chunks, body: dict | None) -> HttpResponse:
    """JSON `body`, or (when there is none: the request streams) Server-Sent Events of the
    `chunks` async generator; then the route headers."""
    if body is None:
        response = StreamingHttpResponse(_event_stream(gen, chunks), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
    else:
        response = JsonResponse(body)
    for name, value in _headers(gen).items():
        response[name] = value
    return response


def sse(data: dict | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def _model_object(d) -> dict:
    return {"id": d.slug, "object": "model", "created": int(d.created_at.timestamp()), "owned_by": "switchyard",
            "root": d.model.name}  # fmt: skip


@openai_view(("GET",))
async def list_models(request):
    caller = await _caller(request)
    deployments = await generation.visible_deployments(caller)
    data = [{**_model_object(d), "max_model_len": d.max_model_len or d.model.context_length} for d in deployments]
    return JsonResponse({"object": "list", "data": data})


@openai_view(("GET",))
async def retrieve_model(request, model_id: str):
    caller = await _caller(request)
    return JsonResponse(_model_object(await generation.resolve_deployment(model_id, caller)))


async def _admit(request, parse) -> tuple[GenerationRequest, generation.Generation]:
    caller = await _caller(request)  # 401 before looking at the body
    req = parse(read_json(request))
    req.timing = request.headers.get("x-switchyard-timing") == "1"
    return req, await generation.start(req, caller, request.headers)


# -- chat --------------------------------------------------------------------------------------
class ChatShaper:
    """Turns replica deltas into chat content and tool calls, for both response styles."""

    def __init__(self, req: GenerationRequest):
        self.parser = ToolCallParser() if req.tools and req.tool_choice != "none" else None
        self.logprobs = req.logprobs
        self.calls: list[ToolCall] = []

    def pieces(self, event: DeltaEvent) -> list[str | ToolCall]:
        if self.parser is None:
            return [event.text] if event.text else []
        out = self.parser.feed(event.text)
        if event.final:
            out += self.parser.finish()
        self.calls += [p for p in out if isinstance(p, ToolCall)]
        return out


@openai_view(("POST",))
async def chat_completions(request):
    req, gen = await _admit(request, parse_chat)
    shapers = [ChatShaper(req) for _ in range(req.params.n)]  # one per choice: each parses its own tool calls
    body = None if req.stream else _chat_whole(req, gen, shapers, await _deltas(gen))
    return _respond(gen, _chat_stream(req, gen, shapers), body)


def _chat_choice(req, index: int, shaper: ChatShaper, events: list[DeltaEvent]) -> dict:
    content, logprobs = [], []
    for event in events:
        content += [p for p in shaper.pieces(event) if isinstance(p, str)]
        logprobs += event.logprobs or []
    text = "".join(content)
    message = {"role": "assistant", "content": text}
    if shaper.calls:
        message["content"] = text.strip() or None
        message["tool_calls"] = [c.as_openai() for c in shaper.calls]
    return {
        "index": index,
        "message": message,
        "logprobs": {"content": _chat_logprobs(logprobs)} if req.logprobs else None,
        "finish_reason": finish_reason(events[-1].finish_reason, bool(shaper.calls)),
    }


def _chat_whole(req, gen, shapers: list[ChatShaper], events: list[DeltaEvent]) -> dict:
    by_choice = _by_choice(events, len(shapers))
    choices = [_chat_choice(req, i, shapers[i], evs) for i, evs in enumerate(by_choice)]
    usage = _usage([evs[-1] for evs in by_choice])
    return _resume_note(gen, {**_envelope(req, gen, "chat.completion", choices), "usage": usage})


async def _chat_stream(req, gen, shapers: list[ChatShaper]):
    def chunk(delta: dict, finish=None, logprobs=None, event=None, index=0) -> bytes:
        choices = [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
        body = _envelope(req, gen, "chat.completion.chunk", choices)
        if req.include_usage:
            body["usage"] = None
        if finish:
            _prefill_note(gen, body)
        return sse(_timing(req, body, event))

    for i in range(len(shapers)):
        yield chunk({"role": "assistant", "content": ""}, index=i)
    finals = []
    async for event in gen.events():
        i, shaper = event.index, shapers[event.index]
        lp = {"content": _chat_logprobs(event.logprobs or [])} if req.logprobs else None
        for piece in shaper.pieces(event):
            if isinstance(piece, ToolCall):
                index = shaper.calls.index(piece)
                yield chunk({"tool_calls": [{"index": index, **piece.as_openai()}]}, index=i)
            elif piece:
                yield chunk({"content": piece}, logprobs=lp, event=event, index=i)
                lp = None
        if lp and lp["content"]:  # held-back text: still report the tokens' logprobs
            yield chunk({}, logprobs=lp, index=i)
        if event.final:
            finals.append(event)
            yield chunk({}, finish=finish_reason(event.finish_reason, bool(shaper.calls)), index=i)
            if req.include_usage and len(finals) == len(shapers):  # after the last choice's end
                yield sse({**_envelope(req, gen, "chat.completion.chunk", []), "usage": _usage(finals)})


# -- completions -------------------------------------------------------------------------------
def _completion_logprobs(entries: list[TokenLogprob], offset: int) -> dict:
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in entries:
        out["tokens"].append(e["token"])
        out["token_logprobs"].append(e["logprob"])
        out["top_logprobs"].append({t["token"]: t["logprob"] for t in e["top"]})
        out["text_offset"].append(offset)
        offset += len(e["token"])
    return out


@openai_view(("POST",))
async def completions(request):
    req, gen = await _admit(request, parse_completion)
    body = None if req.stream else _completion_whole(req, gen, await _deltas(gen))
    return _respond(gen, _completion_stream(req, gen), body)


def _completion_whole(req, gen, events: list[DeltaEvent]) -> dict:
    by_choice = _by_choice(events, req.params.n)
    choices = []
    for i, evs in enumerate(by_choice):
        logprobs = [lp for event in evs for lp in event.logprobs or []]
        choices.append({
            "index": i,
            "text": "".join(event.text for event in evs),
            "logprobs": _completion_logprobs(logprobs, 0) if req.logprobs else None,
            "finish_reason": finish_reason(evs[-1].finish_reason, False),
        })  # fmt: skip
    usage = _usage([evs[-1] for evs in by_choice])
    return _resume_note(gen, {**_envelope(req, gen, "text_completion", choices), "usage": usage})


async def _completion_stream(req, gen):
    offsets = [0] * req.params.n
    finals = []
    async for event in gen.events():
        i = event.index
        lp = _completion_logprobs(event.logprobs or [], offsets[i]) if req.logprobs else None
        offsets[i] += len(event.text)
        choice = {"index": i, "text": event.text, "logprobs": lp,
                  "finish_reason": finish_reason(event.finish_reason, False)}  # fmt: skip
        body = _envelope(req, gen, "text_completion", [choice])
        if req.include_usage:
            body["usage"] = None
        if event.final:
            finals.append(event)
            _prefill_note(gen, body)
        yield sse(_timing(req, body, event))
        if event.final and req.include_usage and len(finals) == req.params.n:
            yield sse({**_envelope(req, gen, "text_completion", []), "usage": _usage(finals)})


@csrf_exempt  # like every /v1 view: an unknown path is a 404 whatever the method, never a CSRF page
def not_found(request, path: str = ""):
    return error_response(GatewayError(404, f"Unknown endpoint {request.method} {request.path}.", code="unknown_url"))
