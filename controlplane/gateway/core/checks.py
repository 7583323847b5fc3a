"""The checks every dialect's parameters go through.

Every problem becomes a 400 naming the parameter (names.py: as the client's API names it), so a
client gets an error in its API's shape rather than a traceback. Every value is range-checked here
(the replica checks again): one that got through and failed inside an engine step would fail every
request sharing the batch. The gateway checks what is cheap of a structured-output spec (shapes,
that a regex compiles, local refs: the protocol's checks) and the replica compiles it for its
vocabulary; a schema it cannot compile comes back as a 400 naming the parameter.
"""

from __future__ import annotations

import json
import math
import re

from controlplane.gateway.core.errors import bad, show
from controlplane.gateway.core.names import ref
from workers.protocol.errors import RequestError
from workers.protocol.grammar import check_grammar, check_refs, check_schema
from workers.protocol.replica import PRIORITY_LIMIT

SEED_MAX = 2**64 - 1  # what torch.Generator takes
INT32_MAX = 2**31 - 1  # max_tokens, top_k, token ids: far past any model, still a plain integer
MAX_SESSION_KEY = 256
MAX_LOGIT_BIAS = 1024  # entries in `logit_bias`
LOGIT_BIAS_RANGE = 100
UNKNOWN = "Unrecognized request argument supplied: '{}'."  # OpenAI's wording


def refuse_unknown(body: dict, known: set[str], unsupported: dict[str, tuple[tuple, str]], unknown: str = UNKNOWN):
    """Nothing is ignored: a parameter not built is a 400 naming it unless it holds a value that
    asks for nothing beyond what is (`unsupported`: name -> (such values, message); null always
    does: it means "not given"), and one not known at all is a 400 too (OpenAI also refuses
    arguments it does not recognise)."""
    for name, value in body.items():
        if name in unsupported:
            accepted, message = unsupported[name]
            # type() too: in Python True == 1 and 0 == False, in JSON they differ
            if value is not None and not any(type(value) is type(ok) and value == ok for ok in accepted):
                raise bad(message, name, "unsupported")
        elif name not in known:
            raise bad(unknown.format(name), name, "unknown_parameter")


def model(body: dict, message: str = "'model' is required: the name of a deployment (see GET /v1/models).") -> str:
    value = body.get("model")
    if not isinstance(value, str) or not value:
        raise bad(message, "model", "missing")
    return value


def typed(body: dict, name: str, kinds, default=None, *, what: str):
    value = body.get(name, default)
    if value is None:
        return default
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    # bool is an int in Python; a JSON true is not a number.
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise bad(f"{ref(name)} must be {what}, got {show(value)}.", name, "invalid_type")
    return value


def in_range(name: str, value, lo, hi):
    if value is not None and ((lo is not None and value < lo) or (hi is not None and value > hi)):
        bounds = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise bad(f"{ref(name)} must be {bounds}, got {show(value)}.", name)
    return value


def number(body, name, default=None, lo=None, hi=None):
    value = typed(body, name, (int, float), default, what="a number")
    if isinstance(value, float) and not math.isfinite(value):  # parse_json refuses these; a dict may not
        raise bad(f"{ref(name)} must be a finite number, got {value}.", name)
    return in_range(name, value, lo, hi)


def integer(body, name, default=None, lo=None, hi=None):
    return in_range(name, typed(body, name, int, default, what="an integer"), lo, hi)


# OpenAI's service tiers as engine priorities (lower runs first; scheduler.py).
SERVICE_TIERS = {"auto": 0, "default": 0, "flex": 1, "priority": -1}


def priority(body: dict) -> int:
    """The request's priority: vLLM's `priority` (an integer, lower first) if given, else its
    OpenAI `service_tier` ("priority" ahead of "default", "flex" after it)."""
    given = integer(body, "priority", None, lo=-PRIORITY_LIMIT, hi=PRIORITY_LIMIT)
    tier = body.get("service_tier")
    if tier is not None and tier not in SERVICE_TIERS:
        tiers = ", ".join(f'"{t}"' for t in SERVICE_TIERS)
        raise bad(
            f"{ref('service_tier')} {show(tier)} is not supported; use one of {tiers}.", "service_tier", "unsupported"
        )
    return given if given is not None else SERVICE_TIERS.get(tier, 0)


def session_key(value, param: str) -> str | None:
    """A session key (body field or header): a non-empty string of at most MAX_SESSION_KEY
    characters, or None when absent."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_SESSION_KEY:
        raise bad(
            f"{ref(param)} must be a non-empty string of at most {MAX_SESSION_KEY} characters.",
            param,
            "invalid_type" if not isinstance(value, str) else "invalid_value",
        )
    return value


def logit_bias(value) -> dict[str, float] | None:
    """OpenAI's `logit_bias`: {token id as a string: bias in [-100, 100]}. The replica checks the
    ids against its vocabulary (a 400 naming `logit_bias` too)."""
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise bad(
            f"'logit_bias' must be an object mapping token ids to numbers, got {show(value)}.",
            "logit_bias",
            "invalid_type",
        )
    if len(value) > MAX_LOGIT_BIAS:
        raise bad(f"'logit_bias' may have at most {MAX_LOGIT_BIAS} entries, got {len(value)}.", "logit_bias")
    out = {}
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 10 and int(key) <= INT32_MAX):
            raise bad(f"'logit_bias' keys must be token ids (non-negative integers), got {show(key)}.", "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise bad(
                f"'logit_bias' values must be numbers, got {show(bias)} for token {key}.", "logit_bias", "invalid_type"
            )
        if not -LOGIT_BIAS_RANGE <= bias <= LOGIT_BIAS_RANGE:
            raise bad(
                f"'logit_bias' values must be between -{LOGIT_BIAS_RANGE} and {LOGIT_BIAS_RANGE}, got {bias} "
                f"for token {key}.",
                "logit_bias",
            )
        out[str(int(key))] = float(bias)
    return out


STRUCTURED_KINDS = ("json", "regex", "choice", "grammar")  # vLLM's `structured_outputs` fields built here


def structured_outputs(value) -> dict | None:
    """vLLM's extra parameter: {"json": schema} | {"regex": str} | {"choice": [str]} | {"grammar": EBNF}."""
    if value is None:
        return None
    name = "structured_outputs"
    if not isinstance(value, dict):
        raise bad(f"'{name}' must be an object.", name, "invalid_type")
    given = {k: v for k, v in value.items() if v is not None}
    unknown = sorted(set(given) - set(STRUCTURED_KINDS))
    if unknown:
        raise bad(
            f"'{name}.{unknown[0]}' is not supported: use one of {', '.join(STRUCTURED_KINDS)}.",
            f"{name}.{unknown[0]}",
            "unsupported",
        )
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
        return {"type": "json_schema", "schema": schema(spec, param)}
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


def schema(value, param: str, *, whole: bool = False) -> dict:
    """A JSON schema whose every `$ref` is local (a remote one would make the replica's grammar
    accept any JSON). `whole`: also what its keywords hold and that its refs point inside it, for
    a tool's parameters, which the replica compiles only when the call is forced (a format's
    schema it always compiles, naming what it cannot)."""
    if not isinstance(value, dict):
        raise bad(f"{ref(param)} must be a JSON schema object, got {show(value)}.", param, "invalid_type")
    try:
        (check_schema if whole else check_refs)(value, param)
    except RequestError as exc:
        raise bad(f"{ref(param)} is not a usable JSON schema: {exc}.", param) from None
    return value


def checked(spec: dict | None, param: str) -> dict | None:
    """What the replica checks before it compiles a spec (its size, tool names, refs), refused
    here before routing."""
    if spec is not None:
        try:
            check_grammar(spec)
        except RequestError as exc:
            raise bad(f"{ref(param)}: {exc}.", param) from None
    return spec
