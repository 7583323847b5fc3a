"""Find tool calls in a model's output, as it streams.

Models trained for tools (the demo model, Qwen, Hermes) write each call as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. The parser is fed text deltas and
returns what the client should see: plain content (holding back anything that could be the
start of a tag) and complete tool calls. A malformed call is passed through as content, so
nothing the model wrote is lost.

After `<tool_call>` the parser reads one JSON object, following its strings and escapes, and
only a `</tool_call>` after that object's end closes the call: an argument may hold the text
`</tool_call>` (a forced call's grammar allows it in any string). A `</tool_call>` outside a
string before the object is complete ends a broken call, shown as text.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from controlplane.gateway.core import GenerationRequest
from workers.protocol.replica import DeltaEvent

OPEN, CLOSE = "<tool_call>", "</tool_call>"
WHITESPACE = " \t\r\n"


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _partial_tag_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def parse_call(body: str) -> ToolCall | None:
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    args = data.get("arguments", data.get("parameters", {}))
    arguments = args if isinstance(args, str) else json.dumps(args)
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=data["name"], arguments=arguments)


class _Body:
    """The text after `<tool_call>`, scanned once as it grows: where its JSON object ends (`end`)
    and where the call does (`close`, past `</tool_call>`); `broken` when it cannot be a call."""

    def __init__(self):
        self.text = ""
        self.pos = 0  # scanned up to here
        self.depth = 0  # open objects and arrays; 0 before the first `{`
        self.in_string = False
        self.escaped = False
        self.end: int | None = None  # just past the object's closing `}`
        self.close: int | None = None  # just past `</tool_call>`
        self.broken = False  # not an object, or a `</tool_call>` cut it: shown as text up to `close`

    def feed(self, text: str) -> None:
        self.text += text
        step = True
        while step and self.close is None:
            if self.broken:
                step = self._close_textually()
            elif self.end is None:
                step = self._scan_value()
            else:
                step = self._after_value()

    def _close_textually(self) -> bool:
        """What is not a call ends at the next `</tool_call>`, as any text would."""
        i = self.text.find(CLOSE, self.pos)
        if i == -1:
            self.pos = max(self.pos, len(self.text) - len(CLOSE) + 1)
        else:
            self.close = i + len(CLOSE)
        return False

    def _scan_value(self) -> bool:
        """Advance through the object; False when more text is needed to go on."""
        text = self.text
        while self.pos < len(text):
            ch = text[self.pos]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif self.depth == 0:
                if ch not in WHITESPACE:
                    if ch != "{":
                        self.broken = True
                        return True
                    self.depth = 1
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.pos += 1
                    self.end = self.pos
                    return True
            elif ch == "<":  # never outside a JSON string: a tag cut the object short
                rest = text[self.pos :]
                if rest.startswith(CLOSE):
                    self.broken, self.close = True, self.pos + len(CLOSE)
                    return True
                if CLOSE.startswith(rest):
                    return False  # maybe the start of `</tool_call>`: wait for more
            self.pos += 1
        return False

    def _after_value(self) -> bool:
        """After the object: whitespace, then `</tool_call>` ends the call; anything else makes
        it broken. False when more text is needed to tell."""
        rest = self.text[self.pos :].lstrip(WHITESPACE)
        if rest.startswith(CLOSE):
            self.close = len(self.text) - len(rest) + len(CLOSE)
        elif not CLOSE.startswith(rest):
            self.broken = True
            return True
        return False

    def call(self) -> ToolCall | None:
        """The call the complete object makes, if it is one."""
        return None if self.broken or self.end is None else parse_call(self.text[: self.end])

    def ends_cleanly(self) -> bool:
        """At the end of the output: the object is complete and nothing but a cut tag follows."""
        return self.end is not None and CLOSE.startswith(self.text[self.end :].strip(WHITESPACE))


class ToolCallParser:
    def __init__(self):
        self.buffer = ""  # text outside a call not yet shown
        self.body: _Body | None = None  # the call being read, after its `<tool_call>`
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[str | ToolCall]:
        """Returns, in order, content strings and complete tool calls made visible by `text`."""
        out: list[str | ToolCall] = []
        while True:
            if self.body is None:
                self.buffer += text
                text = ""
                i = self.buffer.find(OPEN)
                if i == -1:
                    cut = len(self.buffer) - _partial_tag_suffix(self.buffer, OPEN)
                    visible, self.buffer = self.buffer[:cut], self.buffer[cut:]
                    if visible:
                        out.append(visible)
                    return out
                if i:
                    out.append(self.buffer[:i])
                text, self.buffer, self.body = self.buffer[i + len(OPEN) :], "", _Body()
            body = self.body
            body.feed(text)
            if body.close is None:
                return out
            call = body.call()
            if call is None:
                out.append(OPEN + body.text[: body.close])
            else:
                self.calls.append(call)
                out.append(call)
            text, self.body = body.text[body.close :], None

    def finish(self) -> list[str | ToolCall]:
        """At the end of the output: an unterminated call whose object is complete is a call,
        anything else is shown as text."""
        rest, self.buffer = self.buffer, ""
        body, self.body = self.body, None
        if body is None:
            return [rest] if rest else []
        call = body.call() if body.ends_cleanly() else None
        if call is None:
            return [OPEN + body.text]
        self.calls.append(call)
        return [call]


class ChatShaper:
    """One choice's replica deltas as content and tool calls (no parsing when the request has no
    tools, or said 'none'), for every API and both response styles."""

    def __init__(self, req: GenerationRequest):
        self.parser = ToolCallParser() if req.tools and req.tool_choice != "none" else None
        self.logprobs = req.logprobs
        self.calls: list[ToolCall] = []

    def pieces(self, event: DeltaEvent) -> list[str | ToolCall]:
        if self.parser is None:
            return [event.text] if event.text else []
        out = self.parser.feed(event.text)
        if event.final:
            out += self.parser.finish()
        self.calls += [p for p in out if isinstance(p, ToolCall)]
        return out
