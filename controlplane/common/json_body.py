"""JSON request bodies within the limits every surface shares: the OpenAI API (/v1), the
management API (/api/v1) and the websockets.

Python's json module reads more than JSON: `NaN`, `Infinity`, and number literals too large for
a float (`1e999` becomes inf). None of them is JSON and none is a usable parameter, so they are
refused here, named by where they are (`temperature`, `messages[0].content`). Depth is limited
because what reads a body next recurses per level (json itself, the replica's chat template
rendering tools with `tojson`): a deep enough body would be a RecursionError, not a 400.
"""

from __future__ import annotations

import json
import math

from django.conf import settings

_CONTAINERS = frozenset({dict, list})
_CHECKED = frozenset({dict, list, float})  # element types worth looking at inside a list


class BodyError(Exception):
    """A body refused before it is looked at as a request; each surface renders it in its own
    error shape. `param` is the path of the offending value, when there is one."""

    def __init__(self, message: str, *, status: int = 400, code: str = "invalid_json", param: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.param = param


def too_large(size: int | None = None) -> BodyError:
    limit = settings.MAX_REQUEST_BYTES
    got = f"is {size} bytes" if size is not None else "is larger than that"
    return BodyError(
        f"Request bodies are limited to {limit} bytes; this one {got}.", status=413, code="request_too_large"
    )


def load(raw: bytes | str):
    """The JSON value of a request body, or BodyError (413 over MAX_REQUEST_BYTES, otherwise 400)."""
    size = len(raw.encode() if isinstance(raw, str) else raw)
    if size > settings.MAX_REQUEST_BYTES:
        raise too_large(size)
    try:
        value = json.loads(raw)
    except RecursionError:
        raise _too_deep() from None
    except json.JSONDecodeError as exc:
        raise BodyError(
            f"The request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}."
        ) from None
    except UnicodeDecodeError:
        raise BodyError("The request body is not valid UTF-8 text.") from None
    except ValueError:  # an integer literal past Python's 4300-digit limit
        raise BodyError("The request body holds a number too long to read.") from None
    check(value)
    return value


def check(value) -> None:
    """Raise BodyError if `value` nests deeper than MAX_JSON_DEPTH or holds a non-finite float."""
    max_depth = settings.MAX_JSON_DEPTH
    if isinstance(value, float) and not math.isfinite(value):
        raise _not_finite(())
    if type(value) not in _CONTAINERS:
        return
    stack = [(value, (), 1)]
    while stack:
        node, path, depth = stack.pop()
        if depth > max_depth:
            raise _too_deep()
        if isinstance(node, dict):
            items = node.items()
        elif _CHECKED.isdisjoint(map(type, node)):
            continue  # token ids, strings: nothing inside to look at
        else:
            items = enumerate(node)
        for key, item in items:
            if type(item) in _CONTAINERS:
                stack.append((item, (*path, key), depth + 1))
            elif isinstance(item, float) and not math.isfinite(item):
                raise _not_finite((*path, key))


def path_name(path: tuple) -> str:
    """("messages", 0, "content") -> "messages[0].content"."""
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out


def _too_deep() -> BodyError:
    return BodyError(f"The request body nests deeper than {settings.MAX_JSON_DEPTH} levels.")


def _not_finite(path: tuple) -> BodyError:
    name = path_name(path) or None
    where = f"'{name}'" if name else "The request body"
    return BodyError(
        f"{where} must be a finite number: NaN, Infinity and numbers beyond a double are not JSON.",
        code="invalid_value",
        param=name,
    )
