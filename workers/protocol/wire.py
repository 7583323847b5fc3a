"""What the messages of `workers.protocol` share: the error for a message this side cannot
read, how a message's version is checked against the version this side speaks, and `Wire`, the
base that reads and writes a message."""

from __future__ import annotations

import functools
from dataclasses import MISSING, fields
from typing import Any, ClassVar, TypeVar, get_args, get_type_hints

T = TypeVar("T")


class ProtocolError(ValueError):
    """A message that this side cannot read (a newer version, a missing field)."""


def current_version(cls: type) -> int | None:
    """The version this side speaks for `cls`: its `version` field's default (None: unversioned)."""
    spec = cls.__dataclass_fields__.get("version")  # type: ignore[attr-defined]
    return None if spec is None or spec.default is MISSING else spec.default


def check_version(cls: type, data: dict) -> None:
    """Refuse a message newer than this side: it may mean something this side would get wrong.
    A message without a version is this side's (older senders and hand-written ones omit it)."""
    current = current_version(cls)
    if current is None or "version" not in data:
        return
    version = data["version"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise ProtocolError(f"{cls.__name__}: version must be an integer, got {version!r}"[:120])
    if version > current:
        raise ProtocolError(f"{cls.__name__} version {version} is newer than this side's {current}")


def expect_object(cls: type, data: Any) -> dict:
    if not isinstance(data, dict):
        raise ProtocolError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    return data


def from_wire(cls: type[T], data: Any) -> T:
    """`cls` built from the wire's fields of the same names: unknown fields are ignored (a newer
    sender may add optional ones), a newer version is refused, a missing field is an error. A
    field typed as a message (or a message or None) is read from its own wire form."""
    check_version(cls, expect_object(cls, data))
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    values = {k: v for k, v in data.items() if k in known}
    for name, message in _nested_messages(cls).items():
        if isinstance(values.get(name), dict):
            values[name] = message.from_wire(values[name])
    try:
        return cls(**values)
    except TypeError as exc:
        raise ProtocolError(f"{cls.__name__}: {exc}") from None


@functools.cache
def _nested_messages(cls: type) -> dict[str, type[Wire]]:
    """`cls`'s fields whose type is a message (alone or in a union such as `X | None`)."""
    hints = get_type_hints(cls)
    nested = {}
    for f in fields(cls):  # type: ignore[arg-type]
        for kind in get_args(hints[f.name]) or (hints[f.name],):
            if isinstance(kind, type) and issubclass(kind, Wire):
                nested[f.name] = kind
    return nested


class Wire:
    """Base of the protocol's messages (dataclasses). `from_wire` reads one as the function
    above does; `to_wire` writes its fields as a JSON object, shallow (no `asdict`, which copies
    deeply): `type` first when the class has a TYPE, a nested message as its own wire form, and
    a field that is None left out, since the reader's default is None (a field whose None means
    something else writes its own `to_wire`)."""

    __slots__ = ()
    TYPE: ClassVar[str | None] = None

    def to_wire(self) -> dict:
        out: dict[str, Any] = {"type": self.TYPE} if self.TYPE else {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value.to_wire() if isinstance(value, Wire) else value
        return out

    @classmethod
    def from_wire(cls, data: Any):
        return from_wire(cls, data)
