"""OpenAI's chat and completion requests, and the chat every other dialect lowers to.

`parse_chat` is also what Responses and Messages requests become (core/names.py names their
parameters): all endpoints accept and refuse the same values. Fields the engine cannot honour
(echo, best_of...) are refused explicitly instead of silently ignored.
"""

from __future__ import annotations

import json

from controlplane.gateway.core import GenerationRequest, bad, bare, checks, ref, show
from controlplane.gateway.core.checks import INT32_MAX, SEED_MAX, integer, number, typed
from workers.protocol.grammar import tool_name_problem
from workers.protocol.replica import WireSamplingParams

MAX_N = 16  # choices per request (`n`); they share the prompt's KV blocks on the replica

# The parameters this server reads: the OpenAI ones it implements, its extensions (top_k, min_p,
# repetition_penalty, ignore_eos, vLLM's priority) and client metadata with no effect on the answer.
PARAMS = {
    "model", "stream", "stream_options", "stop", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "seed", "presence_penalty", "frequency_penalty", "logprobs", "top_k", "min_p", "repetition_penalty",
    "ignore_eos", "user", "metadata", "safety_identifier", "prompt_cache_key", "structured_outputs", "n",
    "logit_bias", "service_tier", "priority",
}  # fmt: skip
KIND_PARAMS = {
    "chat": {"messages", "tools", "tool_choice", "top_logprobs", "response_format"},
    "completion": {"prompt"},
}
# OpenAI parameters this server does not implement: a 400 naming them, unless they hold a value
# that asks for nothing beyond what is built (null always does: it means "not given").
UNSUPPORTED = {
    "best_of": ((1,), "'best_of' must be 1: best-of sampling is not supported yet."),
    "echo": ((False,), "'echo' is not supported yet."),
    "suffix": (("",), "'suffix' (insertion) is not supported yet."),
    "parallel_tool_calls": (
        (True,),
        "'parallel_tool_calls': false is not supported yet: the model may call several tools in one answer.",
    ),
    "functions": (([],), "'functions' is not supported; use 'tools'."),
    "function_call": ((), "'function_call' is not supported; use 'tool_choice'."),
    "modalities": ((["text"],), "'modalities' other than [\"text\"] is not supported yet."),
    "audio": ((), "'audio' output is not supported yet."),
    "prediction": ((), "'prediction' (predicted outputs) is not supported yet."),
    "web_search_options": ((), "'web_search_options' is not supported yet: there is no web search."),
    "reasoning_effort": ((), "'reasoning_effort' is not supported yet: no reasoning model is served."),
    "verbosity": ((), "'verbosity' is not supported yet."),
    "store": ((False,), "'store': true is not supported yet: completions are not stored."),
}


def _common(body: dict, kind: str) -> GenerationRequest:
    model = checks.model(body)
    checks.refuse_unknown(body, PARAMS | KIND_PARAMS[kind], UNSUPPORTED)
    typed(body, "metadata", dict, None, what="an object")  # accepted (client bookkeeping), not used
    typed(body, "safety_identifier", str, None, what="a string")
    stream = typed(body, "stream", bool, False, what="a boolean")
    options = typed(body, "stream_options", dict, {}, what="an object")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise bad("'stream_options.include_usage' must be a boolean.", "stream_options.include_usage", "invalid_type")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4):
        raise bad(f"{ref('stop')} must be a string or a list of at most 4 strings.", "stop", "invalid_type")
    max_tokens = integer(body, "max_completion_tokens", None, lo=1, hi=INT32_MAX)
    if max_tokens is None:
        max_tokens = integer(body, "max_tokens", None, lo=1, hi=INT32_MAX)
    params = WireSamplingParams(
        temperature=number(body, "temperature", 1.0, 0, 2),
        top_p=number(body, "top_p", 1.0, 0, 1),
        top_k=integer(body, "top_k", -1, lo=-1, hi=INT32_MAX),
        min_p=number(body, "min_p", 0.0, 0, 1),
        presence_penalty=number(body, "presence_penalty", 0.0, -2, 2),
        frequency_penalty=number(body, "frequency_penalty", 0.0, -2, 2),
        repetition_penalty=number(body, "repetition_penalty", 1.0, 0.01, 10),
        seed=integer(body, "seed", None, lo=0, hi=SEED_MAX),
        max_tokens=max_tokens if max_tokens is not None else (16 if kind == "completion" else None),
        stop=stop or [],
        ignore_eos=typed(body, "ignore_eos", bool, False, what="a boolean"),
    )
    if params.top_p == 0:
        raise bad("'top_p' must be greater than 0.", "top_p")
    params.n = integer(body, "n", 1, lo=1)
    if params.n > MAX_N:
        raise bad(f"'n' must be at most {MAX_N} (choices per request on this server), got {params.n}.", "n")
    if params.seed is not None and params.seed + params.n - 1 > SEED_MAX:
        raise bad(f"'seed' + 'n' - 1 must be at most {SEED_MAX}: choice i samples with seed + i.", "seed")
    params.logit_bias = checks.logit_bias(body.get("logit_bias"))
    params.grammar = checks.checked(checks.structured_outputs(body.get("structured_outputs")), "structured_outputs")
    typed(body, "user", str, None, what="a string")  # accepted (OpenAI clients send it), not used
    return GenerationRequest(
        kind=kind,
        model=model,
        stream=stream,
        include_usage=bool(stream and include_usage),
        params=params,
        prompt_cache_key=checks.session_key(body.get("prompt_cache_key"), "prompt_cache_key"),
        priority=checks.priority(body),
    )


def _response_format(value) -> dict | None:
    """OpenAI's `response_format`: text (no grammar), json_object, or json_schema."""
    name = "response_format"
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise bad(f"{ref(name)} must be an object with a 'type'.", name, "invalid_type")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise bad(f"'{name}.type' must be 'text', 'json_object' or 'json_schema', got {show(kind)}.", f"{name}.type")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise bad(
            f"'{name}.json_schema' must be an object with 'name' and 'schema'.",
            f"{name}.json_schema",
            "missing" if spec is None else "invalid_type",
        )
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise bad(f"'{name}.json_schema.name' must be a non-empty string.", f"{name}.json_schema.name", "missing")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise bad(f"'{name}.json_schema.strict' must be a boolean.", f"{name}.json_schema.strict", "invalid_type")
    # strict or not, the output is generated to match the schema (constrained decoding).
    schema = spec.get("schema")
    return {
        "type": "json_schema",
        "schema": {} if schema is None else checks.schema(schema, f"{name}.json_schema.schema"),
    }


def _tool_grammar(tools: list[dict], choice) -> dict:
    """`tool_choice` "required" or a named function: one call of a given tool, its arguments
    matching the tool's parameter schema."""
    functions = [t["function"] for t in tools]
    if isinstance(choice, dict):
        name = choice["function"].get("name")
        if not isinstance(name, str):
            param = "tool_choice.function.name"
            raise bad(f"{ref(param)} must be a string.", param, "invalid_type")
        functions = [f for f in functions if f["name"] == name]
        if not functions:
            known = ", ".join(t["function"]["name"] for t in tools)
            raise bad(
                f"'tool_choice' names the function {show(name)}, which is not in 'tools' ({known}).",
                "tool_choice.function.name",
            )
    return {
        "type": "tool_call",
        "tools": [{"name": f["name"], "parameters": f.get("parameters") or {}} for f in functions],
    }


def _tools(tools) -> list[dict] | None:
    """Every tool is checked whatever the `tool_choice` (as OpenAI does): a name no other tool
    has, and parameters the replica could compile into a forced call's grammar."""
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict)
        and t.get("type", "function") == "function"
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
        for t in tools
    ):
        raise bad('\'tools\' must be a list of {"type": "function", "function": {"name": ...}}.', "tools")
    problem = tool_name_problem([t["function"]["name"] for t in tools])
    if problem is not None:
        i, first = problem
        name = f"tools[{i}].function.name"
        if first is None:
            raise bad(f"{ref(name)} must be a non-empty string.", name)
        raise bad(
            f"{ref(name)} must be unique: {show(tools[i]['function']['name'])} is also the name of "
            f"{bare(f'tools[{first}]')}.",
            name,
        )
    for i, tool in enumerate(tools):
        parameters, param = tool["function"].get("parameters"), f"tools[{i}].function.parameters"
        if parameters is None:
            continue
        if not isinstance(parameters, dict):
            raise bad(f"{ref(param)} must be a JSON schema object, got {show(parameters)}.", param, "invalid_type")
        kind = parameters.get("type", "object")
        if kind != "object" and not (isinstance(kind, list) and "object" in kind):
            # Arguments are an object of named parameters, in every API this gateway speaks.
            raise bad(f"{ref(param)} must describe an object ('type': 'object'), got 'type': {show(kind)}.", param)
        checks.schema(parameters, param, whole=True)
    return tools or None


def parse_completion(body: dict) -> GenerationRequest:
    req = _common(body, "completion")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise bad("'prompt' must not be empty.", "prompt")
        req.prompt = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if not all(0 <= t <= INT32_MAX for t in prompt):
            raise bad(f"Token ids in 'prompt' must be between 0 and {INT32_MAX}.", "prompt")
        req.prompt_token_ids = prompt
    else:
        raise bad("'prompt' must be a non-empty string or a list of token ids (one prompt per request).", "prompt")
    logprobs = integer(body, "logprobs", None, lo=0, hi=20)
    if logprobs is not None:
        req.logprobs = True
        req.params.logprobs = logprobs
    return req


def _message_text(content, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad("Only text content parts are supported.", f"messages[{index}].content", "unsupported")
            parts.append(part["text"])
        return "".join(parts)
    raise bad("'content' must be a string or a list of text parts.", f"messages[{index}].content", "invalid_type")


ROLES = ("system", "developer", "user", "assistant", "tool")


def parse_chat(body: dict) -> GenerationRequest:
    req = _common(body, "chat")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad(
            f"{ref('messages')} must be a non-empty list.",
            "messages",
            "missing" if messages is None else "invalid_type",
        )
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad("Each message must be an object.", f"messages[{i}]", "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"'role' must be one of {', '.join(ROLES)}; got {json.dumps(role)}.", f"messages[{i}].role")
        out = {"role": "system" if role == "developer" else role, "content": _message_text(m.get("content"), i)}
        if role == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"]
            if not isinstance(calls, list) or not all(
                isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls
            ):
                raise bad("'tool_calls' must be a list of function calls.", f"messages[{i}].tool_calls")
            out["tool_calls"] = calls
        if role == "tool" and m.get("tool_call_id"):
            if not isinstance(m["tool_call_id"], str):
                raise bad("'tool_call_id' must be a string.", f"messages[{i}].tool_call_id", "invalid_type")
            out["tool_call_id"] = m["tool_call_id"]
        clean.append(out)
    req.messages = clean
    req.tools = _tools(body.get("tools"))
    choice = body.get("tool_choice", "auto")
    if choice not in ("auto", "none", "required") and not (
        isinstance(choice, dict) and isinstance(choice.get("function"), dict)
    ):
        raise bad("'tool_choice' must be 'auto', 'none', 'required' or a named function.", "tool_choice")
    if choice not in ("auto", "none") and not req.tools:
        raise bad("'tool_choice' needs 'tools'.", "tool_choice")
    req.tool_choice = choice
    grammars = {}
    if choice not in ("auto", "none"):
        grammars["tool_choice"] = _tool_grammar(req.tools, choice)
    fmt = _response_format(body.get("response_format"))
    if fmt is not None:
        grammars["response_format"] = fmt
    if req.params.grammar is not None:
        grammars["structured_outputs"] = req.params.grammar
    if len(grammars) > 1:
        first, second = list(grammars)[:2]
        raise bad(f"{ref(first)} and {ref(second)} both constrain the output: send one.", second)
    if grammars:
        ((param, spec),) = grammars.items()
        req.params.grammar = checks.checked(spec, param)
    req.logprobs = typed(body, "logprobs", bool, False, what="a boolean")
    top = integer(body, "top_logprobs", None, lo=0, hi=20)
    if top is not None and not req.logprobs:
        raise bad("'top_logprobs' needs 'logprobs': true.", "top_logprobs")
    if req.logprobs:
        req.params.logprobs = top or 0
    return req
