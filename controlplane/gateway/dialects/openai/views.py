"""The OpenAI-compatible HTTP API: /v1/models, /v1/completions, /v1/chat/completions: replica
deltas shaped into OpenAI's JSON and chunks (http.py answers and streams them)."""

from __future__ import annotations

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from controlplane.gateway import generation
from controlplane.gateway.core import GatewayError, GenerationRequest, counts, read_json
from controlplane.gateway.dialects.openai.request import parse_chat, parse_completion
from controlplane.gateway.http import (
    api_view,
    bearer_caller,
    deltas,
    error_response,
    prefill_note,
    respond,
    resume_note,
    sse,
)
from controlplane.gateway.tool_calls import ChatShaper, ToolCall
from workers.protocol.replica import DeltaEvent, TokenLogprob


def _usage(finals: list[DeltaEvent]) -> dict:
    """Usage from each choice's last delta (a stream ends with one per choice, or with an
    error): the prompt once, the completion tokens of every choice."""
    n = counts(finals)
    return {
        "prompt_tokens": n.prompt,
        "completion_tokens": n.completion,
        "total_tokens": n.prompt + n.completion,
        "prompt_tokens_details": {"cached_tokens": n.cached},
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


def _model_object(d) -> dict:
    return {
        "id": d.slug,
        "object": "model",
        "created": int(d.created_at.timestamp()),
        "owned_by": "switchyard",
        "root": d.model.name,
    }


@api_view(("GET",))
async def list_models(request):
    caller = await bearer_caller(request)
    deployments = await generation.visible_deployments(caller)
    data = [{**_model_object(d), "max_model_len": d.max_model_len or d.model.context_length} for d in deployments]
    return JsonResponse({"object": "list", "data": data})


@api_view(("GET",))
async def retrieve_model(request, model_id: str):
    caller = await bearer_caller(request)
    return JsonResponse(_model_object(await generation.resolve_deployment(model_id, caller)))


def _failed(exc: GatewayError) -> bytes:
    """A stream that fails ends with the error as an event (then [DONE])."""
    return sse(exc.body())


async def _admit(request, parse) -> tuple[GenerationRequest, generation.Generation]:
    caller = await bearer_caller(request)  # 401 before looking at the body
    req = parse(read_json(request))
    req.timing = request.headers.get("x-switchyard-timing") == "1"
    return req, await generation.start(req, caller, request.headers)


# -- chat --------------------------------------------------------------------------------------
@api_view(("POST",))
async def chat_completions(request):
    req, gen = await _admit(request, parse_chat)
    shapers = [ChatShaper(req) for _ in range(req.params.n)]  # one per choice: each parses its own tool calls
    body = None if req.stream else _chat_whole(req, gen, shapers, await deltas(gen))
    return respond(gen, body, _chat_stream(req, gen, shapers), _failed, sse("[DONE]"))


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
    return resume_note(gen, {**_envelope(req, gen, "chat.completion", choices), "usage": usage})


async def _chat_stream(req, gen, shapers: list[ChatShaper]):
    def chunk(delta: dict, finish=None, logprobs=None, event=None, index=0) -> bytes:
        choices = [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
        body = _envelope(req, gen, "chat.completion.chunk", choices)
        if req.include_usage:
            body["usage"] = None
        if finish:
            prefill_note(gen, body)
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


@api_view(("POST",))
async def completions(request):
    req, gen = await _admit(request, parse_completion)
    body = None if req.stream else _completion_whole(req, gen, await deltas(gen))
    return respond(gen, body, _completion_stream(req, gen), _failed, sse("[DONE]"))


def _completion_whole(req, gen, events: list[DeltaEvent]) -> dict:
    by_choice = _by_choice(events, req.params.n)
    choices = []
    for i, evs in enumerate(by_choice):
        logprobs = [lp for event in evs for lp in event.logprobs or []]
        choices.append(
            {
                "index": i,
                "text": "".join(event.text for event in evs),
                "logprobs": _completion_logprobs(logprobs, 0) if req.logprobs else None,
                "finish_reason": finish_reason(evs[-1].finish_reason, False),
            }
        )
    usage = _usage([evs[-1] for evs in by_choice])
    return resume_note(gen, {**_envelope(req, gen, "text_completion", choices), "usage": usage})


async def _completion_stream(req, gen):
    offsets = [0] * req.params.n
    finals = []
    async for event in gen.events():
        i = event.index
        lp = _completion_logprobs(event.logprobs or [], offsets[i]) if req.logprobs else None
        offsets[i] += len(event.text)
        choice = {
            "index": i,
            "text": event.text,
            "logprobs": lp,
            "finish_reason": finish_reason(event.finish_reason, False),
        }
        body = _envelope(req, gen, "text_completion", [choice])
        if req.include_usage:
            body["usage"] = None
        if event.final:
            finals.append(event)
            prefill_note(gen, body)
        yield sse(_timing(req, body, event))
        if event.final and req.include_usage and len(finals) == req.params.n:
            yield sse({**_envelope(req, gen, "text_completion", []), "usage": _usage(finals)})


@csrf_exempt  # like every /v1 view: an unknown path is a 404 whatever the method, never a CSRF page
def not_found(request, path: str = ""):
    return error_response(GatewayError(404, f"Unknown endpoint {request.method} {request.path}.", code="unknown_url"))
