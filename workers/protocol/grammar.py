"""Structured-output specs (`WireSamplingParams.grammar`), checked alike by the gateway and the
engine. Torch-free: the gateway refuses here what the replica would, before routing; the engine
checks again (a replica trusts no sender) and compiles what passes (workers/engine/structured.py).

What is checked without compiling: the spec's shape, tool names (non-empty, unique), and every
`$ref` of a schema: xgrammar resolves only `#` and JSON pointers `#/...` into the schema itself,
and reads any other `$ref` (`http://...`, `other.json#/x`, `#anchor`) as "any JSON", so a schema
with one would constrain nothing. `check_schema` also checks what each keyword holds and that
each pointer leads somewhere: the gateway runs it on every tool's parameters, whatever the
`tool_choice`, since only a forced call's schema is ever compiled.
"""

from __future__ import annotations

import json
from urllib.parse import unquote

from workers.protocol.errors import RequestError

# The client's parameter each kind comes from, for a 400 naming it.
GRAMMAR_PARAMS = {
    "json_object": "response_format",
    "json_schema": "response_format",
    "regex": "structured_outputs",
    "choice": "structured_outputs",
    "grammar": "structured_outputs",
    "tool_call": "tool_choice",
}
MAX_SPEC_BYTES = 256 * 1024  # a schema or grammar past this is refused before compiling
_FIELDS = {
    "json_object": {},
    "json_schema": {"schema": dict},
    "regex": {"regex": str},
    "choice": {"choice": list},
    "grammar": {"grammar": str},
    "tool_call": {"tools": list},
}


def check_grammar(spec) -> dict:
    """A structured-output spec's shape and refs, or a RequestError naming the parameter."""
    if not isinstance(spec, dict) or spec.get("type") not in GRAMMAR_PARAMS:
        raise RequestError(f"grammar must be an object whose type is one of {', '.join(GRAMMAR_PARAMS)}", "grammar")
    kind = spec["type"]
    param = GRAMMAR_PARAMS[kind]
    expected = _FIELDS[kind]
    for name, kinds in expected.items():
        if not isinstance(spec.get(name), kinds):
            raise RequestError(f"grammar.{name} must be a {kinds.__name__} for type {kind!r}", param)
    extra = set(spec) - {"type", *expected}
    if extra:
        raise RequestError(f"unknown grammar field {sorted(extra)[0]!r}", param)
    if kind == "choice" and not (spec["choice"] and all(isinstance(c, str) and c for c in spec["choice"])):
        raise RequestError("choice must be a non-empty list of non-empty strings", param)
    if kind == "tool_call":
        tools = spec["tools"]
        if not (tools and all(isinstance(t, dict) and isinstance(t.get("parameters", {}), dict) for t in tools)):
            raise RequestError("tools must be a non-empty list of {name, parameters}", param)
        problem = tool_name_problem([t.get("name") for t in tools])
        if problem is not None:
            i, first = problem
            why = "a non-empty string" if first is None else f"unique (tool {first} has it too)"
            raise RequestError(f"tools[{i}].name must be {why}", param)
        for tool in tools:
            check_refs(tool.get("parameters") or {}, param)
    if kind == "json_schema":
        check_refs(spec["schema"], param)
    if len(json.dumps(spec)) > MAX_SPEC_BYTES:
        raise RequestError(f"the {param} grammar is larger than {MAX_SPEC_BYTES} bytes", param)
    return spec


def tool_name_problem(names: list) -> tuple[int, int | None] | None:
    """The first bad tool name, if any: (its index, None) when it is no string or blank, (its
    index, the index of its first use) when repeated (a call names its tool: two of one name
    would make it ambiguous)."""
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name.strip():
            return i, None
        if name in seen:
            return i, seen[name]
        seen[name] = i
    return None


# Keywords whose value is a subschema, a list of them, or a map of names to them (drafts 4 to
# 2020-12); `$ref`s anywhere else (inside `enum`, `const`, `default`, `examples`) are data.
_ONE = ("additionalProperties", "additionalItems", "unevaluatedProperties", "unevaluatedItems", "items", "contains",
        "propertyNames", "not", "if", "then", "else", "contentSchema")  # fmt: skip
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")


def _subschemas(schema: dict):
    return (child for child, _ in _children(schema, ""))


def _resolves(root: dict, ref: str) -> bool:
    """Whether the JSON pointer fragment of `ref` ("#", "#/a/b") names a value inside `root`."""
    node = root
    for part in ref[2:].split("/") if ref != "#" else ():
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def check_refs(schema: dict, param: str, *, resolve: bool = False) -> None:
    """Every `$ref` of `schema` is local: a remote or relative one (not starting with `#`) or an
    anchor (`#name`) is a RequestError naming `param`; with `resolve`, so is a pointer to nothing
    (the replica's compiler refuses that one itself, but only a compiled schema meets it)."""
    stack = [schema]  # iterative: a schema nests as deep as its JSON does
    while stack:
        node = stack.pop()
        ref = node.get("$ref")
        if ref is not None:
            if not isinstance(ref, str):
                raise RequestError(f"$ref must be a string, got {json.dumps(ref)[:80]}", param)
            if not ref.startswith("#"):
                raise RequestError(
                    f"remote $ref {ref[:200]!r} is not supported; inline the schema (refer to its "
                    "parts with '#/$defs/...')",
                    param,
                )
            if ref != "#" and not ref.startswith("#/"):
                raise RequestError(
                    f"$ref {ref[:200]!r} is not supported: refer to '#' or a JSON pointer such as '#/$defs/name'", param
                )
            if resolve and not _resolves(schema, ref):
                raise RequestError(f"$ref {ref[:200]!r} points at nothing in the schema", param)
        stack.extend(_subschemas(node))


TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
# What each keyword of the JSON Schema vocabularies (drafts 4 to 2020-12) holds; other keywords
# are free annotations. A subschema is an object or a boolean.
_COUNTS = ("maxLength", "minLength", "maxItems", "minItems", "maxProperties", "minProperties", "maxContains",
           "minContains")  # fmt: skip
_NUMBERS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_STRINGS = ("pattern", "format", "title", "description", "$id", "$anchor", "$comment", "$schema", "contentEncoding",
            "contentMediaType")  # fmt: skip
_BOOLS = ("uniqueItems", "readOnly", "writeOnly", "deprecated")


def _is_schema(value) -> bool:
    return isinstance(value, (dict, bool))


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _keyword_problem(key: str, value) -> str | None:
    """Why `value` cannot be the value of keyword `key`, or None."""
    if key == "type":
        kinds = value if isinstance(value, list) else [value]
        if not (kinds and all(isinstance(k, str) and k in TYPES for k in kinds)):
            return f"{json.dumps(value)[:80]} is not a JSON type or a list of them ({', '.join(TYPES)})"
    elif key in _ONE and key != "items" and not _is_schema(value):
        return "must be a schema (an object or a boolean)"
    elif key == "items" and not (_is_schema(value) or (isinstance(value, list) and all(map(_is_schema, value)))):
        return "must be a schema or a list of schemas"
    elif key in _LIST and key != "items" and not (value and isinstance(value, list) and all(map(_is_schema, value))):
        return "must be a non-empty list of schemas"
    elif (
        key in _MAP and key != "dependencies" and not (isinstance(value, dict) and all(map(_is_schema, value.values())))
    ):
        return "must be an object whose values are schemas"
    elif key == "dependencies" and not (
        isinstance(value, dict) and all(_is_schema(v) or _strings(v) for v in value.values())
    ):
        return "must be an object whose values are schemas or lists of property names"
    elif key in ("required", "dependentRequired"):
        ok = _strings(value) if key == "required" else isinstance(value, dict) and all(map(_strings, value.values()))
        if not ok:
            return "must be a list of property names" if key == "required" else "must map names to lists of names"
    elif key in _COUNTS and not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return "must be a non-negative integer"
    elif key in _NUMBERS and not (_is_number(value) or (key.startswith("exclusive") and isinstance(value, bool))):
        return "must be a number"  # draft 4's exclusiveMinimum/Maximum were booleans
    elif key == "enum" and not isinstance(value, list):
        return "must be a list of values"
    elif key in _STRINGS and not isinstance(value, str):
        return "must be a string"
    elif key in _BOOLS and not isinstance(value, bool):
        return "must be a boolean"
    return None


def _children(schema: dict, path: str):
    """(subschema, its path) of each object subschema of `schema`."""
    for key in _ONE:
        if isinstance(schema.get(key), dict):
            yield schema[key], f"{path}.{key}"
    for key in _LIST:
        if isinstance(schema.get(key), list):
            yield from ((s, f"{path}.{key}[{i}]") for i, s in enumerate(schema[key]) if isinstance(s, dict))
    for key in _MAP:
        if isinstance(schema.get(key), dict):
            yield from ((s, f"{path}.{key}.{name}") for name, s in schema[key].items() if isinstance(s, dict))


def check_schema(schema: dict, param: str) -> None:
    """`schema` is a JSON schema whose keywords hold what they must and whose refs all point
    inside it; else a RequestError naming `param` and where the schema is wrong. One pass over
    the schema: validating against the 2020-12 metaschema with `jsonschema` took seconds for a
    large schema, on the gateway's event loop."""
    check_refs(schema, param, resolve=True)
    stack = [(schema, "")]
    while stack:
        node, path = stack.pop()
        for key, value in node.items():
            problem = _keyword_problem(key, value)
            if problem is not None:
                where = f"{path}.{key}".lstrip(".")
                raise RequestError(f"invalid JSON schema at {where[:200]}: {problem}", param)
        stack.extend(_children(node, path))
