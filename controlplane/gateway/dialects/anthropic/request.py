"""Parse and validate a `POST /v1/messages` body (Anthropic's Messages API).

The request becomes a chat: `system` the system message, `text` blocks message content,
`tool_use` blocks an assistant's tool calls, `tool_result` blocks tool messages; `tools`
(`input_schema`) the chat endpoint's function tools and `tool_choice` any/tool its enforced
choice. The chat parser (dialects/openai/request.py) then checks and builds what the replica is
sent, naming this API's parameters (NAMES). Every problem is a GatewayError the view answers in
Anthropic's error shape; every parameter this server does not build is a 400 naming it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from controlplane.gateway.core import GatewayError, GenerationRequest, Names, bad, checks, naming
from controlplane.gateway.core.checks import INT32_MAX
from controlplane.gateway.dialects.openai.request import parse_chat

PARAMS = {
    "model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p", "top_k",
    "metadata", "tools", "tool_choice", "thinking", "service_tier", "output_config", "cache_control", "speed",
}  # fmt: skip
# Not built: a 400 unless empty (or null).
UNSUPPORTED = {
    "container": (([],), "'container' is not supported: no code execution tool is built."),
    "mcp_servers": (([],), "'mcp_servers' is not supported: the gateway connects to no MCP server."),
    "context_management": (([],), "'context_management' is not supported: the conversation is sent as it is."),
    "inference_geo": (([],), "'inference_geo' is not supported: a deployment runs where its replicas are."),
    "diagnostics": (([],), "'diagnostics' is not supported."),
    "user_profile_id": (
        ([],),
        "'user_profile_id' is not supported: API keys, not user profiles, identify callers here.",
    ),
    "workspace_id": (([],), "'workspace_id' is not supported: API keys, not workspaces, scope callers here."),
}


# Answered in Anthropic's error shape, even by the ASGI handler.
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}  # fmt: skip


def error_body(exc: GatewayError) -> dict:
    """An error in Anthropic's shape: {"type": "error", "error": {"type", "message"}}."""
    kind = ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


@dataclass
class MessagesRequest:
    model: str
    stream: bool
    req: GenerationRequest


def _string(value, param: str, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise bad(f"{param}: must be a{' non-empty' if not empty else ''} string.", param, "invalid_type")
    return value


def _number(body: dict, name: str, lo: float, hi: float):
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo <= value <= hi:
        raise bad(f"{name}: must be a number between {lo} and {hi}.", name)
    return value


def _cache_control(block: dict, param: str) -> None:
    """Accepted: the replicas cache every prompt's prefix blocks, marked or not."""
    mark = block.get("cache_control")
    if mark is not None and not (isinstance(mark, dict) and mark.get("type") == "ephemeral"):
        raise bad(f'{param}.cache_control: must be {{"type": "ephemeral"}}.', f"{param}.cache_control")


def _text_block(block, param: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text":
        raise bad(f"{param}: must be a text block.", param, "invalid_type")
    if block.get("citations"):
        raise bad(f"{param}.citations: citations are not supported.", f"{param}.citations", "unsupported")
    _cache_control(block, param)
    return _string(block.get("text"), f"{param}.text")


def _text(content, param: str) -> str:
    """A string, or a list of text blocks."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"{param}: must be a string or a list of text blocks.", param, "invalid_type")
    return "".join(_text_block(b, f"{param}.{j}") for j, b in enumerate(content))


def _blocks(content, param: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not content:
        raise bad(f"{param}: must be a string or a non-empty list of content blocks.", param, "invalid_type")
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise bad(f"{param}.{j}: must be a content block with a 'type'.", f"{param}.{j}", "invalid_type")
    return content


UNREAD = {
    "image": "images",
    "document": "documents",
    "search_result": "search results",
    "thinking": "thinking blocks",
    "redacted_thinking": "thinking blocks",
}


def _unsupported_block(kind: str, param: str, role: str) -> GatewayError:
    if kind in UNREAD:
        return bad(
            f"{param}: {kind} blocks are not supported: the served models read text, not {UNREAD[kind]}.",
            f"{param}.type",
            "unsupported",
        )
    allowed = "text and tool_result" if role == "user" else "text and tool_use"
    return bad(
        f"{param}.type: {json.dumps(kind)} blocks are not supported in a {role} message ({allowed} are).",
        f"{param}.type",
        "unsupported",
    )


def chat_messages(messages) -> list[dict]:
    """`messages` as chat messages: a user turn's tool results become tool messages (in order,
    beside its text), an assistant turn's tool_use blocks its tool calls."""
    if not isinstance(messages, list) or not messages:
        raise bad("messages: must be a non-empty list.", "messages", "missing" if messages is None else "invalid_type")
    out: list[dict] = []
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(m, dict):
            raise bad(f"{where}: must be an object.", where, "invalid_type")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise bad(f"{where}.role: must be 'user' or 'assistant', got {json.dumps(role)}.", f"{where}.role")
        blocks = _blocks(m.get("content"), f"{where}.content")
        texts: list[str] = []
        calls: list[dict] = []
        for j, block in enumerate(blocks):
            param, kind = f"{where}.content.{j}", block["type"]
            if kind == "text":
                texts.append(_text_block(block, param))
            elif kind == "tool_result" and role == "user":
                if texts:  # text before a result stays before it
                    out.append({"role": "user", "content": "".join(texts)})
                    texts = []
                _cache_control(block, param)
                result = _text(block.get("content", ""), f"{param}.content")
                error = block.get("is_error")
                if error is not None and not isinstance(error, bool):
                    raise bad(f"{param}.is_error: must be a boolean.", f"{param}.is_error", "invalid_type")
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": _string(block.get("tool_use_id"), f"{param}.tool_use_id", empty=False),
                        "content": f"Error: {result}" if error else result,
                    }
                )
            elif kind == "tool_use" and role == "assistant":
                _cache_control(block, param)
                arguments = block.get("input")
                if not isinstance(arguments, dict):
                    raise bad(f"{param}.input: must be an object.", f"{param}.input", "invalid_type")
                calls.append({"id": _string(block.get("id"), f"{param}.id", empty=False), "type": "function",
                              "function": {"name": _string(block.get("name"), f"{param}.name", empty=False),
                                           "arguments": json.dumps(arguments)}})  # fmt: skip
            else:
                raise _unsupported_block(kind, param, role)
        if role == "assistant":
            message = {"role": "assistant", "content": "".join(texts)}
            if calls:
                message["tool_calls"] = calls
            out.append(message)
        elif texts:
            out.append({"role": "user", "content": "".join(texts)})
    if messages[-1].get("role") != "user":
        raise bad(
            "messages: the last message must be the user's: continuing an assistant turn (prefill) is not supported.",
            f"messages.{len(messages) - 1}.role",
            "unsupported",
        )
    return out


def _tools(tools, forced: bool) -> list[dict] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad("tools: must be a list of tools.", "tools", "invalid_type")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict):
            raise bad(f"{where}: must be an object.", where, "invalid_type")
        if tool.get("type") not in (None, "custom"):
            raise bad(
                f"{where}.type: {json.dumps(tool.get('type'))} is not supported: only custom tools (name, "
                "input_schema) are; server and client tools such as web search, bash or the text editor are "
                "not built.",
                f"{where}.type",
                "unsupported",
            )
        _cache_control(tool, where)
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise bad(
                f"{where}.input_schema: must be a JSON schema object.",
                f"{where}.input_schema",
                "missing" if schema is None else "invalid_type",
            )
        strict = tool.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad(f"{where}.strict: must be a boolean.", f"{where}.strict", "invalid_type")
        if strict and not forced:
            raise bad(
                f"{where}.strict: true is enforced only when the call is forced (tool_choice any or tool); "
                "with auto the input is parsed, not constrained.",
                f"{where}.strict",
                "unsupported",
            )
        unknown = sorted(set(tool) - {"type", "name", "description", "input_schema", "cache_control", "strict"})
        if unknown:
            raise bad(f"{where}.{unknown[0]}: is not supported.", f"{where}.{unknown[0]}", "unknown_parameter")
        function = {"name": _string(tool.get("name"), f"{where}.name", empty=False), "parameters": schema}
        if tool.get("description"):
            function["description"] = _string(tool["description"], f"{where}.description")
        out.append({"type": "function", "function": function})
    return out or None


def _tool_choice(value) -> str | dict:
    """auto, none; `any` is the chat endpoint's enforced "required", `tool` its named function."""
    if value is None:
        return "auto"
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise bad('tool_choice: must be {"type": "auto" | "any" | "tool" | "none"}.', "tool_choice")
    single = value.get("disable_parallel_tool_use")
    if single is not None and not isinstance(single, bool):
        raise bad("tool_choice.disable_parallel_tool_use: must be a boolean.", "tool_choice.disable_parallel_tool_use")
    if single and kind == "auto":  # any/tool already answer with exactly one call (the grammar's)
        raise bad(
            "tool_choice.disable_parallel_tool_use: true is supported with 'any' or 'tool' only: with 'auto' "
            "the model may call several tools in one answer.",
            "tool_choice.disable_parallel_tool_use",
            "unsupported",
        )
    if kind == "tool":
        return {"type": "function", "function": {"name": _string(value.get("name"), "tool_choice.name", empty=False)}}
    return {"auto": "auto", "any": "required", "none": "none"}[kind]


def _output_format(value) -> dict | None:
    """`output_config.format` (a JSON schema) as the chat endpoint's `response_format`."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad("output_config: must be an object.", "output_config", "invalid_type")
    unknown = sorted(set(value) - {"format", "effort"})
    if unknown:
        raise bad(f"output_config.{unknown[0]}: is not supported.", f"output_config.{unknown[0]}", "unknown_parameter")
    if value.get("effort") is not None:
        raise bad(
            "output_config.effort: is not supported: no reasoning model is served.",
            "output_config.effort",
            "unsupported",
        )
    fmt = value.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise bad('output_config.format: must be {"type": "json_schema", "schema": {...}}.', "output_config.format")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def _settings(body: dict) -> None:
    """The accepted parameters that must ask for nothing beyond what is built."""
    thinking = body.get("thinking")
    if thinking is not None and not (isinstance(thinking, dict) and thinking.get("type") == "disabled"):
        raise bad(
            'thinking: only {"type": "disabled"} is supported: no reasoning model is served.', "thinking", "unsupported"
        )
    if body.get("service_tier") not in (None, "auto", "standard_only"):
        raise bad("service_tier: must be 'auto' or 'standard_only'.", "service_tier")
    if body.get("speed") not in (None, "standard"):
        raise bad("speed: only 'standard' is supported.", "speed", "unsupported")
    if body.get("cache_control") is not None:
        _cache_control(body, "")
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict) or set(metadata) - {"user_id"}:
            raise bad("metadata: may only hold 'user_id'.", "metadata")
        if metadata.get("user_id") is not None:
            _string(metadata["user_id"], "metadata.user_id")


# parse_chat's names as this API's (unquoted, as its messages name parameters; a chat tool's
# `function` is a Messages tool's own fields, its `parameters` the `input_schema`).
NAMES = Names(
    renames=(
        ("response_format.json_schema.schema", "output_config.format.schema"),
        ("response_format", "output_config.format"),
        ("stop", "stop_sequences"),
    ),
    nested="",
    tools=(
        (re.compile(r"\btools\[(\d+)\]\.function\.parameters\b"), r"tools.\1.input_schema"),
        (re.compile(r"\btools\[(\d+)\]\.function\.(\w+)"), r"tools.\1.\2"),
        (re.compile(r"\btools\[(\d+)\]"), r"tools.\1"),
    ),
    quoted=False,
)


def parse_messages(body: dict) -> MessagesRequest:
    model = checks.model(body, "model: Field required (the name of a deployment, see GET /v1/models).")
    checks.refuse_unknown(body, PARAMS, UNSUPPORTED, "{}: Extra inputs are not permitted.")
    _settings(body)
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= INT32_MAX:
        raise bad(
            f"max_tokens: {'Field required' if max_tokens is None else 'must be an integer >= 1'}.",
            "max_tokens",
            "missing" if max_tokens is None else "invalid_value",
        )
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad("stream: must be a boolean.", "stream", "invalid_type")
    top_k = body.get("top_k")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= INT32_MAX):
        raise bad("top_k: must be an integer >= 1.", "top_k")
    top_p = _number(body, "top_p", 0, 1)
    if top_p == 0:
        raise bad("top_p: must be greater than 0.", "top_p")
    stop = body.get("stop_sequences")
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise bad("stop_sequences: must be a list of non-empty strings.", "stop_sequences", "invalid_type")
    choice = _tool_choice(body.get("tool_choice"))
    messages = chat_messages(body.get("messages"))
    system = body.get("system")
    if system is not None:
        system = _text(system, "system")
        if system:
            messages.insert(0, {"role": "system", "content": system})
    chat = {
        "model": model, "messages": messages, "max_tokens": max_tokens, "stream": stream,
        "temperature": _number(body, "temperature", 0, 1), "top_p": top_p, "top_k": top_k, "stop": stop or None,
        "tools": _tools(body.get("tools"), choice not in ("auto", "none")), "tool_choice": choice,
        "response_format": _output_format(body.get("output_config")),
    }  # fmt: skip
    with naming(NAMES):
        req = parse_chat({k: v for k, v in chat.items() if v is not None})
    return MessagesRequest(model=model, stream=req.stream, req=req)


# What /v1/messages/count_tokens does not take: it counts a prompt, it generates nothing.
NOT_COUNTED = ("max_tokens", "stream", "temperature", "top_p", "top_k", "stop_sequences", "metadata", "service_tier")


def parse_count_tokens(body: dict) -> MessagesRequest:
    """A `/v1/messages/count_tokens` body: the prompt part of a Messages request."""
    extra = next((name for name in NOT_COUNTED if name in body), None)
    if extra is not None:
        raise bad(f"{extra}: Extra inputs are not permitted.", extra, "unknown_parameter")
    return parse_messages({**body, "max_tokens": 1})
