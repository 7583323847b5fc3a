"""How a dialect names the chat parameters its requests are checked as.

Responses and Messages requests are lowered to a chat and run through the chat's checks; their
errors must still name what the client sent (`text.format`, `tools.1.input_schema`), not the
chat's `response_format`. Each dialect declares its names once; while its request is checked
(`naming`), a check builds its message with `ref` and a GatewayError maps its `param`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class Names:
    # (chat path, this API's path); `nested`: which longer paths a rename covers ("[": the
    # items of a list, "": anything it prefixes)
    renames: tuple[tuple[str, str], ...] = ()
    nested: str = "["
    # (pattern, replacement) turning a chat tool's path into this API's, in order
    tools: tuple[tuple[re.Pattern, str], ...] = ()
    quoted: bool = True  # a message quotes a parameter it renames (OpenAI's wording) or not

    def param(self, path: str | None) -> str | None:
        """The error's `param` for the chat's `path`."""
        if path is None:
            return None
        for old, new in self.renames:
            if path == old or path.startswith(old + self.nested):
                path = new + path[len(old) :]
                break
        return self._tool(path)

    def bare(self, path: str) -> str:
        """The chat's `path` as a message names it, unquoted."""
        return self._tool(dict(self.renames).get(path, path))

    def ref(self, path: str) -> str:
        """The chat's `path` as a message names it: quoted, as OpenAI's messages do."""
        shown = self.bare(path)
        return f"'{shown}'" if self.quoted or shown == path else shown

    def _tool(self, path: str) -> str:
        for pattern, new in self.tools:
            path = pattern.sub(new, path)
        return path


OPENAI = Names()
_active: ContextVar[Names] = ContextVar("gateway_names", default=OPENAI)


def current() -> Names:
    return _active.get()


def ref(path: str) -> str:
    return _active.get().ref(path)


def bare(path: str) -> str:
    return _active.get().bare(path)


@contextmanager
def naming(names: Names) -> Iterator[None]:
    """Errors created inside name parameters as `names` does."""
    token = _active.set(names)
    try:
        yield
    finally:
        _active.reset(token)
