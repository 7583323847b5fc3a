"""Parse and validate OpenAI request bodies into what a replica understands.

Every problem becomes an `OpenAIError` naming the parameter, so a client gets a 400 in
OpenAI's error shape rather than a traceback. Fields the engine cannot honour (echo,
best_of...) are refused explicitly instead of silently ignored. Every value is range-checked
here (the replica checks again): one that got through and failed inside an engine step would
fail every request sharing the batch.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from controlplane.common import json_body
from workers.protocol.errors import RequestError
from workers.protocol.grammar import check_grammar, check_refs, check_schema, tool_name_problem
from workers.protocol.replica import GenerateMessage, WireSamplingParams

SEED_MAX = 2**64 - 1  # what torch.Generator takes
INT32_MAX = 2**31 - 1  # max_tokens, top_k, token ids: far past any model, still a plain integer


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
             404: "not_found_error", 429: "rate_limit_error", 503: "service_unavailable"}  # fmt: skip

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None, headers=None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    @property
    def type(self) -> str:
        return self.TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


@dataclass
class GenerationRequest:
    """A validated request: what to send to the replica plus how to shape the answer."""

    kind: str  # "chat" | "completion"
    model: str
    stream: bool = False
    include_usage: bool = False
    messages: list[dict] | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict = "auto"
    prompt: str | None = None
    # The prompt's ids: the client's (a completion prompt of ids), else the gateway's own
    # tokenisation before routing (tokenization.py); None while untokenised, and when the gateway
    # cannot read the model (the replica tokenises then).
    prompt_token_ids: list[int] | None = None
    params: WireSamplingParams = field(default_factory=WireSamplingParams)
    logprobs: bool = False
    timing: bool = False  # `x-switchyard-timing: 1`: stream chunks carry when the replica produced them
    # OpenAI's `prompt_cache_key`: the same session key as the cache policy's affinity header
    prompt_cache_key: str | None = None

    @property
    def template_tools(self) -> list[dict] | None:
        """The tools the chat template renders into the prompt (none when the client said 'none')."""
        return self.tools if self.tools and self.tool_choice != "none" else None

    def replica_message(self) -> GenerateMessage:
        """What the replica is sent; the hub fills in `id` and `reply_to` when it sends it. The
        ids once known (the replica needs no tools: the gateway parses tool calls itself)."""
        if self.prompt_token_ids is not None:
            return GenerateMessage(params=self.params, prompt_token_ids=self.prompt_token_ids)
        if self.kind == "chat":
            return GenerateMessage(params=self.params, messages=self.messages, tools=self.template_tools)
        return GenerateMessage(params=self.params, prompt=self.prompt)


def parse_json(raw: bytes | str) -> dict:
    """A request body as a dict, within the request limits (size 413; depth, NaN/Infinity 400)."""
    try:
        body = json_body.load(raw or b"")
    except json_body.BodyError as exc:
        raise _body_error(exc) from None
    if not isinstance(body, dict):
        raise bad("The request body must be a JSON object.", code="invalid_json")
    return body


def too_large(size: int | None = None) -> OpenAIError:
    """The 413 of a body over MAX_REQUEST_BYTES (`size`: its length, when known)."""
    return _body_error(json_body.too_large(size))


def _body_error(exc: json_body.BodyError) -> OpenAIError:
    return OpenAIError(exc.status, exc.message, exc.param, exc.code)


def _show(value) -> str:
    """A value for an error message, short (an int past 4300 digits cannot even be str'd)."""
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else "an array"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"a {value.bit_length()}-bit integer"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _typed(body: dict, name: str, kinds, default=None, *, what: str):
    value = body.get(name, default)
    if value is None:
        return default
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    # bool is an int in Python; a JSON true is not a number.
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise bad(f"'{name}' must be {what}, got {_show(value)}.", name, "invalid_type")
    return value


def _in_range(name: str, value, lo, hi):
    if value is not None and ((lo is not None and value < lo) or (hi is not None and value > hi)):
        bounds = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise bad(f"'{name}' must be {bounds}, got {_show(value)}.", name)
    return value


def _number(body, name, default=None, lo=None, hi=None):
    value = _typed(body, name, (int, float), default, what="a number")
    if isinstance(value, float) and not math.isfinite(value):  # parse_json refuses these; a dict may not
        raise bad(f"'{name}' must be a finite number, got {value}.", name)
    return _in_range(name, value, lo, hi)


def _integer(body, name, default=None, lo=None, hi=None):
    return _in_range(name, _typed(body, name, int, default, what="an integer"), lo, hi)


# The parameters this server reads: the OpenAI ones it implements, its extensions (top_k, min_p,
# repetition_penalty, ignore_eos) and client metadata with no effect on the answer.
PARAMS = {
    "model", "stream", "stream_options", "stop", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "seed", "presence_penalty", "frequency_penalty", "logprobs", "top_k", "min_p", "repetition_penalty",
    "ignore_eos", "user", "metadata", "safety_identifier", "prompt_cache_key", "structured_outputs", "n",
    "logit_bias",
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
    "parallel_tool_calls": ((True,), "'parallel_tool_calls': false is not supported yet: the model may call "
                            "several tools in one answer."),
    "service_tier": (("auto", "default"), "'service_tier' other than \"auto\" or \"default\" is not supported yet."),
    "functions": (([],), "'functions' is not supported; use 'tools'."),
    "function_call": ((), "'function_call' is not supported; use 'tool_choice'."),
    "modalities": ((["text"],), "'modalities' other than [\"text\"] is not supported yet."),
    "audio": ((), "'audio' output is not supported yet."),
    "prediction": ((), "'prediction' (predicted outputs) is not supported yet."),
    "web_search_options": ((), "'web_search_options' is not supported yet: there is no web search."),
    "reasoning_effort": ((), "'reasoning_effort' is not supported yet: no reasoning model is served."),
    "verbosity": ((), "'verbosity' is not supported yet."),
    "store": ((False,), "'store': true is not supported yet: completions are not stored."),
}  # fmt: skip


def _refuse_unsupported(body: dict, kind: str) -> None:
    """Nothing is ignored: an unbuilt parameter or an unknown one is a 400 naming it (OpenAI
    also refuses arguments it does not recognise)."""
    for name, value in body.items():
        if name in UNSUPPORTED:
            accepted, message = UNSUPPORTED[name]
            # type() too: in Python True == 1 and 0 == False, in JSON they differ
            if value is not None and not any(type(value) is type(ok) and value == ok for ok in accepted):
                raise bad(message, name, "unsupported")
        elif name not in PARAMS and name not in KIND_PARAMS[kind]:
            raise bad(f"Unrecognized request argument supplied: '{name}'.", name, "unknown_parameter")
    _typed(body, "metadata", dict, None, what="an object")  # accepted (client bookkeeping), not used
    _typed(body, "safety_identifier", str, None, what="a string")


def _common(body: dict, kind: str) -> GenerationRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' is required: the name of a deployment (see GET /v1/models).", "model", "missing")
    _refuse_unsupported(body, kind)
    stream = _typed(body, "stream", bool, False, what="a boolean")
    options = _typed(body, "stream_options", dict, {}, what="an object")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise bad("'stream_options.include_usage' must be a boolean.", "stream_options.include_usage", "invalid_type")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4):
        raise bad("'stop' must be a string or a list of at most 4 strings.", "stop", "invalid_type")
    max_tokens = _integer(body, "max_completion_tokens", None, lo=1, hi=INT32_MAX)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", None, lo=1, hi=INT32_MAX)
    params = WireSamplingParams(
        temperature=_number(body, "temperature", 1.0, 0, 2),
        top_p=_number(body, "top_p", 1.0, 0, 1),
        top_k=_integer(body, "top_k", -1, lo=-1, hi=INT32_MAX),
        min_p=_number(body, "min_p", 0.0, 0, 1),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2, 2),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2, 2),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.01, 10),
        seed=_integer(body, "seed", None, lo=0, hi=SEED_MAX),
        max_tokens=max_tokens if max_tokens is not None else (16 if kind == "completion" else None),
        stop=stop or [],
        ignore_eos=_typed(body, "ignore_eos", bool, False, what="a boolean"),
    )
    if params.top_p == 0:
        raise bad("'top_p' must be greater than 0.", "top_p")
    params.n = _integer(body, "n", 1, lo=1)
    if params.n > MAX_N:
        raise bad(f"'n' must be at most {MAX_N} (choices per request on this server), got {params.n}.", "n")
    if params.seed is not None and params.seed + params.n - 1 > SEED_MAX:
        raise bad(f"'seed' + 'n' - 1 must be at most {SEED_MAX}: choice i samples with seed + i.", "seed")
    params.logit_bias = _logit_bias(body.get("logit_bias"))
    params.grammar = _checked(_structured_outputs(body.get("structured_outputs")), "structured_outputs")
    _typed(body, "user", str, None, what="a string")  # accepted (OpenAI clients send it), not used
    return GenerationRequest(
        kind=kind,
        model=model,
        stream=stream,
        include_usage=bool(stream and include_usage),
        params=params,
        prompt_cache_key=session_key(body.get("prompt_cache_key"), "prompt_cache_key"),
    )


MAX_N = 16  # choices per request (`n`); they share the prompt's KV blocks on the replica
MAX_LOGIT_BIAS = 1024  # entries in `logit_bias`
LOGIT_BIAS_RANGE = 100


def _logit_bias(value) -> dict[str, float] | None:
    """OpenAI's `logit_bias`: {token id as a string: bias in [-100, 100]}. The replica checks the
    ids against its vocabulary (a 400 naming `logit_bias` too)."""
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise bad(f"'logit_bias' must be an object mapping token ids to numbers, got {_show(value)}.", "logit_bias",
                  "invalid_type")  # fmt: skip
    if len(value) > MAX_LOGIT_BIAS:
        raise bad(f"'logit_bias' may have at most {MAX_LOGIT_BIAS} entries, got {len(value)}.", "logit_bias")
    out = {}
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 10 and int(key) <= INT32_MAX):
            raise bad(f"'logit_bias' keys must be token ids (non-negative integers), got {_show(key)}.", "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise bad(f"'logit_bias' values must be numbers, got {_show(bias)} for token {key}.", "logit_bias",
                      "invalid_type")  # fmt: skip
        if not -LOGIT_BIAS_RANGE <= bias <= LOGIT_BIAS_RANGE:
            raise bad(f"'logit_bias' values must be between -{LOGIT_BIAS_RANGE} and {LOGIT_BIAS_RANGE}, got {bias} "
                      f"for token {key}.", "logit_bias")  # fmt: skip
        out[str(int(key))] = float(bias)
    return out


MAX_SESSION_KEY = 256


def session_key(value, param: str) -> str | None:
    """A session key (body field or header): a non-empty string of at most MAX_SESSION_KEY
    characters, or None when absent."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_SESSION_KEY:
        raise bad(f"'{param}' must be a non-empty string of at most {MAX_SESSION_KEY} characters.", param,
                  "invalid_type" if not isinstance(value, str) else "invalid_value")  # fmt: skip
    return value


# -- structured output ------------------------------------------------------------------------
# The gateway checks what is cheap (shapes, that a regex compiles, that a named tool exists, that
# a schema's refs are local, every tool's schema: the protocol's checks) and sends the replica a
# grammar spec (workers/engine/structured.py); the replica compiles it for its vocabulary, and a
# schema it cannot compile comes back as a 400 naming the parameter.
STRUCTURED_KINDS = ("json", "regex", "choice", "grammar")  # vLLM's `structured_outputs` fields built here


def _structured_outputs(value) -> dict | None:
    """vLLM's extra parameter: {"json": schema} | {"regex": str} | {"choice": [str]} | {"grammar": EBNF}."""
    if value is None:
        return None
    name = "structured_outputs"
    if not isinstance(value, dict):
        raise bad(f"'{name}' must be an object.", name, "invalid_type")
    given = {k: v for k, v in value.items() if v is not None}
    unknown = sorted(set(given) - set(STRUCTURED_KINDS))
    if unknown:
        raise bad(f"'{name}.{unknown[0]}' is not supported: use one of {', '.join(STRUCTURED_KINDS)}.",
                  f"{name}.{unknown[0]}", "unsupported")  # fmt: skip
    if len(given) != 1:
        raise bad(f"'{name}' must hold exactly one of {', '.join(STRUCTURED_KINDS)}.", name)
    ((kind, spec),) = given.items()
    param = f"{name}.{kind}"
    if kind == "json":
        if isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except json.JSONDecodeError:
                raise bad(f"'{param}' must be a JSON schema (an object, or its JSON text).", param) from None
        return {"type": "json_schema", "schema": _schema(spec, param)}
    if kind == "regex":
        if not isinstance(spec, str) or not spec:
            raise bad(f"'{param}' must be a non-empty string.", param, "invalid_type")
        try:
            re.compile(spec)
        except re.error as exc:
            raise bad(f"'{param}' is not a valid regular expression: {exc}.", param) from None
        return {"type": "regex", "regex": spec}
    if kind == "choice":
        if not (isinstance(spec, list) and spec and all(isinstance(c, str) and c for c in spec)):
            raise bad(f"'{param}' must be a non-empty list of non-empty strings.", param, "invalid_type")
        return {"type": "choice", "choice": spec}
    if not isinstance(spec, str) or not spec.strip():
        raise bad(f"'{param}' must be a non-empty EBNF grammar (root ::= ...).", param, "invalid_type")
    return {"type": "grammar", "grammar": spec}


def _schema(schema, param: str, *, whole: bool = False) -> dict:
    """A JSON schema whose every `$ref` is local (a remote one would make the replica's grammar
    accept any JSON). `whole`: also what its keywords hold and that its refs point inside it, for
    a tool's parameters, which the replica compiles only when the call is forced (a format's
    schema it always compiles, naming what it cannot)."""
    if not isinstance(schema, dict):
        raise bad(f"'{param}' must be a JSON schema object, got {_show(schema)}.", param, "invalid_type")
    try:
        (check_schema if whole else check_refs)(schema, param)
    except RequestError as exc:
        raise bad(f"'{param}' is not a usable JSON schema: {exc}.", param) from None
    return schema


def _checked(spec: dict | None, param: str) -> dict | None:
    """What the replica checks before it compiles a spec (its size, tool names, refs), refused
    here before routing."""
    if spec is not None:
        try:
            check_grammar(spec)
        except RequestError as exc:
            raise bad(f"'{param}': {exc}.", param) from None
    return spec


def _response_format(value) -> dict | None:
    """OpenAI's `response_format`: text (no grammar), json_object, or json_schema."""
    name = "response_format"
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise bad(f"'{name}' must be an object with a 'type'.", name, "invalid_type")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise bad(f"'{name}.type' must be 'text', 'json_object' or 'json_schema', got {_show(kind)}.", f"{name}.type")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise bad(f"'{name}.json_schema' must be an object with 'name' and 'schema'.", f"{name}.json_schema", "missing"
                  if spec is None else "invalid_type")  # fmt: skip
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise bad(f"'{name}.json_schema.name' must be a non-empty string.", f"{name}.json_schema.name", "missing")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise bad(f"'{name}.json_schema.strict' must be a boolean.", f"{name}.json_schema.strict", "invalid_type")
    # strict or not, the output is generated to match the schema (constrained decoding).
    schema = spec.get("schema")
    return {"type": "json_schema", "schema": {} if schema is None else _schema(schema, f"{name}.json_schema.schema")}


def _tool_grammar(tools: list[dict], choice) -> dict:
    """`tool_choice` "required" or a named function: one call of a given tool, its arguments
    matching the tool's parameter schema."""
    functions = [t["function"] for t in tools]
    if isinstance(choice, dict):
        name = choice["function"].get("name")
        if not isinstance(name, str):
            raise bad("'tool_choice.function.name' must be a string.", "tool_choice.function.name", "invalid_type")
        functions = [f for f in functions if f["name"] == name]
        if not functions:
            known = ", ".join(t["function"]["name"] for t in tools)
            raise bad(f"'tool_choice' names the function {_show(name)}, which is not in 'tools' ({known}).",
                      "tool_choice.function.name")  # fmt: skip
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
        isinstance(t, dict) and t.get("type", "function") == "function" and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
        for t in tools
    ):  # fmt: skip
        raise bad('\'tools\' must be a list of {"type": "function", "function": {"name": ...}}.', "tools")
    problem = tool_name_problem([t["function"]["name"] for t in tools])
    if problem is not None:
        i, first = problem
        name = f"tools[{i}].function.name"
        if first is None:
            raise bad(f"'{name}' must be a non-empty string.", name)
        raise bad(f"'{name}' must be unique: {_show(tools[i]['function']['name'])} is also the name of "
                  f"tools[{first}].", name)  # fmt: skip
    for i, tool in enumerate(tools):
        parameters, param = tool["function"].get("parameters"), f"tools[{i}].function.parameters"
        if parameters is None:
            continue
        if not isinstance(parameters, dict):
            raise bad(f"'{param}' must be a JSON schema object, got {_show(parameters)}.", param, "invalid_type")
        kind = parameters.get("type", "object")
        if kind != "object" and not (isinstance(kind, list) and "object" in kind):
            # Arguments are an object of named parameters, in every API this gateway speaks.
            raise bad(f"'{param}' must describe an object ('type': 'object'), got 'type': {_show(kind)}.", param)
        _schema(parameters, param, whole=True)
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
    logprobs = _integer(body, "logprobs", None, lo=0, hi=20)
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
        raise bad("'messages' must be a non-empty list.", "messages", "missing" if messages is None else "invalid_type")
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
            if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                                      for c in calls):  # fmt: skip
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
        raise bad(f"'{first}' and '{second}' both constrain the output: send one.", second)
    if grammars:
        ((param, spec),) = grammars.items()
        req.params.grammar = _checked(spec, param)
    req.logprobs = _typed(body, "logprobs", bool, False, what="a boolean")
    top = _integer(body, "top_logprobs", None, lo=0, hi=20)
    if top is not None and not req.logprobs:
        raise bad("'top_logprobs' needs 'logprobs': true.", "top_logprobs")
    if req.logprobs:
        req.params.logprobs = top or 0
    return req
