"""Parse and validate a `POST /v1/responses` body (OpenAI's Responses API).

A Responses request is a chat in other words: its `input` items become chat messages (after the
stored conversation `previous_response_id` names, and `instructions` as the system message), its
flat function tools the chat endpoint's tools, `text.format` its `response_format`. The chat
parser (dialects/openai/request.py) then checks and builds what the replica is sent, so both
endpoints accept and refuse the same values; its errors name this API's parameters (NAMES).
Every Responses parameter this server does not build is a 400 naming it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from controlplane.gateway.core import GenerationRequest, Names, bad, checks, naming
from controlplane.gateway.core.checks import INT32_MAX
from controlplane.gateway.dialects.openai.request import parse_chat

# Read here; each maps to the chat parameter of the same meaning or shapes the answer.
PARAMS = {
    "model", "input", "instructions", "tools", "tool_choice", "max_output_tokens", "temperature", "top_p",
    "text", "stream", "stream_options", "store", "previous_response_id", "metadata", "user", "safety_identifier",
    "prompt_cache_key", "parallel_tool_calls", "service_tier",
}  # fmt: skip
# Responses parameters not built: a 400 unless the value asks for nothing beyond what is.
UNSUPPORTED = {
    "background": ((False,), "'background': true is not supported: responses run while the request is open."),
    "conversation": ((), "'conversation' (the Conversations API) is not supported; use 'previous_response_id'."),
    "include": (([],), "'include' is not supported yet: no extra output (logprobs, reasoning, tool sources) is built."),
    "max_tool_calls": ((), "'max_tool_calls' is not supported: it bounds built-in tools, and none is built."),
    "prompt": ((), "'prompt' (stored prompt templates) is not supported."),
    "reasoning": ((), "'reasoning' is not supported yet: no reasoning model is served."),
    "top_logprobs": ((0,), "'top_logprobs' is not supported yet on /v1/responses."),
    "truncation": (("disabled",), "'truncation': \"auto\" is not supported: an input over the context is a 400."),
    "prompt_cache_retention": (
        ("in_memory",),
        "'prompt_cache_retention' other than \"in_memory\" is not "
        "supported: cached prefixes live in the replicas' KV cache and its tiers.",
    ),
}
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
MAX_ID = 64


@dataclass
class ResponsesRequest:
    """A validated Responses request; `chat_body` (with the stored history) is what parse_chat reads."""

    model: str
    input_messages: list[dict]
    instructions: str | None = None
    tools: list[dict] = field(default_factory=list)  # as the client sent them (echoed in the response)
    tool_choice: str | dict = "auto"
    text_format: dict = field(default_factory=lambda: {"type": "text"})
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict = field(default_factory=dict)
    user: str | None = None
    chat: dict = field(default_factory=dict)  # the chat parameters, messages left out

    def generation_request(self, history: list[dict]) -> GenerationRequest:
        """The chat request to run: instructions, the stored history, then this input."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        with naming(NAMES):
            return parse_chat({**self.chat, "messages": system + history + self.input_messages})


# parse_chat's parameter names, as this API calls them (a chat tool's `function` is a Responses
# tool's own fields).
NAMES = Names(
    renames=(
        ("response_format.json_schema.schema", "text.format.schema"),
        ("response_format", "text.format"),
        ("max_tokens", "max_output_tokens"),
        ("messages", "input"),
        ("tool_choice.function.name", "tool_choice.name"),
    ),
    tools=((re.compile(r"\btools\[(\d+)\]\.function\."), r"tools[\1]."),),
)


def _string(value, param: str, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise bad(f"'{param}' must be a{' non-empty' if not empty else ''} string.", param, "invalid_type")
    return value


def _text_parts(content, param: str, kinds: tuple[str, ...]) -> str:
    """A message's content: a string, or a list of text parts of the given types."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"'{param}' must be a string or a list of content parts.", param, "invalid_type")
    texts = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            if kind in ("input_image", "input_file", "input_audio"):
                raise bad(
                    f"'{where}': {kind} content is not supported: the served models read text.", where, "unsupported"
                )
            raise bad(f"'{where}.type' must be one of {', '.join(kinds)}, got {json.dumps(kind)}.", f"{where}.type")
        texts.append(_string(part.get("text"), f"{where}.text"))
    return "".join(texts)


def _call_id(value, param: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID * 4:
        raise bad(f"'{param}' must be a non-empty string.", param, "invalid_type")
    return value


def input_messages(value) -> list[dict]:
    """`input` (a string, or a list of input items) as chat messages."""
    if isinstance(value, str):
        if not value:
            raise bad("'input' must not be empty.", "input")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad(
            "'input' must be a non-empty string or a non-empty list of input items.",
            "input",
            "missing" if value is None else "invalid_type",
        )
    out: list[dict] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(f"'{where}' must be an object.", where, "invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise bad(f"'{where}.role' must be one of {', '.join(ROLES)}, got {json.dumps(role)}.", f"{where}.role")
            kinds = ("output_text", "text") if role == "assistant" else ("input_text", "text")
            text = _text_parts(item.get("content"), f"{where}.content", kinds)
            out.append({"role": ROLES[role], "content": text})
        elif kind == "function_call":
            call = {
                "id": _call_id(item.get("call_id"), f"{where}.call_id"),
                "type": "function",
                "function": {
                    "name": _string(item.get("name"), f"{where}.name", empty=False),
                    "arguments": _string(item.get("arguments"), f"{where}.arguments"),
                },
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # one assistant turn: its text and its calls
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = _text_parts(output, f"{where}.output", ("input_text",))
            out.append(
                {"role": "tool", "tool_call_id": _call_id(item.get("call_id"), f"{where}.call_id"), "content": text}
            )
        else:
            raise bad(
                f"'{where}.type' {json.dumps(kind)} is not supported: input items are messages, function_call "
                "and function_call_output.",
                f"{where}.type",
                "unsupported",
            )
    return out


def _tools(value, tool_choice) -> tuple[list[dict], list[dict]]:
    """The function tools as the client sent them and in the chat endpoint's shape."""
    if value is None:
        return [], []
    if not isinstance(value, list):
        raise bad("'tools' must be a list of function tools.", "tools", "invalid_type")
    chat = []
    forced = tool_choice not in ("auto", "none")
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise bad(
                f"'{where}': only function tools are supported, not {json.dumps(kind)} (built-in tools such as "
                "web search, file search or code interpreter are not built).",
                f"{where}.type",
                "unsupported",
            )
        name = _string(tool.get("name"), f"{where}.name", empty=False)
        parameters = tool.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise bad(f"'{where}.parameters' must be a JSON schema object.", f"{where}.parameters", "invalid_type")
        strict = tool.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad(f"'{where}.strict' must be a boolean.", f"{where}.strict", "invalid_type")
        if strict and not forced and tool_choice != "none":
            raise bad(
                f"'{where}.strict': true is enforced only when the call is forced: send tool_choice "
                '"required" or a named function, or strict: false (with "auto" the arguments are parsed, '
                "not constrained).",
                f"{where}.strict",
                "unsupported",
            )
        description = tool.get("description")
        if description is not None:
            _string(description, f"{where}.description")
        function = {"name": name, "parameters": parameters or {"type": "object", "properties": {}}}
        if description:
            function["description"] = description
        chat.append({"type": "function", "function": function})
    return value, chat


def _tool_choice(value) -> tuple[str | dict, str | dict]:
    """`tool_choice` as sent and as the chat endpoint's."""
    if value is None:
        return "auto", "auto"
    if value in ("auto", "none", "required"):
        return value, value
    if isinstance(value, dict) and value.get("type") == "function":
        name = _string(value.get("name"), "tool_choice.name", empty=False)
        return value, {"type": "function", "function": {"name": name}}
    kind = value.get("type") if isinstance(value, dict) else None
    if kind is not None:
        raise bad(
            f'\'tool_choice\' of type {json.dumps(kind)} is not supported: use "auto", "none", "required" '
            'or {"type": "function", "name": ...}.',
            "tool_choice.type",
            "unsupported",
        )
    raise bad('\'tool_choice\' must be "auto", "none", "required" or {"type": "function", "name": ...}.', "tool_choice")


def _text_format(value) -> tuple[dict, dict | None]:
    """`text` ({"format": ...}) as echoed and as the chat endpoint's `response_format`."""
    if value is None:
        return {"type": "text"}, None
    if not isinstance(value, dict):
        raise bad("'text' must be an object.", "text", "invalid_type")
    unknown = sorted(set(value) - {"format", "verbosity"})
    if unknown:
        raise bad(f"Unrecognized argument 'text.{unknown[0]}'.", f"text.{unknown[0]}", "unknown_parameter")
    if value.get("verbosity") is not None:
        raise bad("'text.verbosity' is not supported yet.", "text.verbosity", "unsupported")
    fmt = value.get("format")
    if fmt is None:
        return {"type": "text"}, None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise bad("'text.format' must be an object with a 'type'.", "text.format", "invalid_type")
    kind = fmt["type"]
    if kind in ("text", "json_object"):
        return fmt, {"type": kind}
    if kind != "json_schema":
        raise bad(
            f"'text.format.type' must be 'text', 'json_object' or 'json_schema', got {json.dumps(kind)}.",
            "text.format.type",
        )
    spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
    return fmt, {"type": "json_schema", "json_schema": spec}


def response_id(value, param: str = "previous_response_id") -> str:
    if not isinstance(value, str) or not value.startswith("resp_") or len(value) > MAX_ID:
        raise bad(f"'{param}' must be the id of a response (resp_...), got {json.dumps(value)[:80]}.", param)
    return value


def parse_responses(body: dict) -> ResponsesRequest:
    model = checks.model(body)
    checks.refuse_unknown(body, PARAMS, UNSUPPORTED)
    shown_choice, chat_choice = _tool_choice(body.get("tool_choice"))
    tools, chat_tools = _tools(body.get("tools"), chat_choice)
    shown_format, response_format = _text_format(body.get("text"))
    instructions = body.get("instructions")
    if instructions is not None:
        _string(instructions, "instructions")
    store = body.get("store")
    if store is not None and not isinstance(store, bool):
        raise bad("'store' must be a boolean.", "store", "invalid_type")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or set(options) - {"include_obfuscation"}:
            raise bad("'stream_options' may only hold 'include_obfuscation'.", "stream_options")
        if options.get("include_obfuscation"):
            raise bad(
                "'stream_options.include_obfuscation': true is not supported: stream events carry no padding.",
                "stream_options.include_obfuscation",
                "unsupported",
            )
    max_output = body.get("max_output_tokens")
    if max_output is not None and (
        not isinstance(max_output, int) or isinstance(max_output, bool) or not 1 <= max_output <= INT32_MAX
    ):
        raise bad(f"'max_output_tokens' must be an integer between 1 and {INT32_MAX}.", "max_output_tokens")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise bad("'metadata' must be an object.", "metadata", "invalid_type")
    previous = body.get("previous_response_id")
    chat = {"model": model, "stream": body.get("stream"), "tools": chat_tools or None, "tool_choice": chat_choice,
            "response_format": response_format, "max_tokens": max_output}  # fmt: skip
    for name in ("temperature", "top_p", "user", "safety_identifier", "prompt_cache_key", "parallel_tool_calls",
                 "metadata", "service_tier"):  # fmt: skip
        chat[name] = body.get(name)
    req = ResponsesRequest(
        model=model,
        input_messages=input_messages(body.get("input")),
        instructions=instructions or None,
        tools=tools,
        tool_choice=shown_choice,
        text_format=shown_format,
        max_output_tokens=max_output,
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        store=store is not False,
        previous_response_id=response_id(previous) if previous is not None else None,
        metadata=metadata or {},
        user=body.get("user"),
        chat={k: v for k, v in chat.items() if v is not None},
    )
    # Everything parse_chat checks (types and ranges, tool names, formats), without a history yet.
    req.stream = req.generation_request([]).stream
    return req
