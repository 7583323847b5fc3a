"""Find tool calls in a model's output, as it streams.

Models trained for tools (the demo model, Qwen, Hermes) write each call as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. The parser is fed text deltas and
returns what the client should see: plain content (holding back anything that could be the
start of a tag) and complete tool calls. A malformed call is passed through as content, so
nothing the model wrote is lost.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"


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


class ToolCallParser:
    def __init__(self):
        self.buffer = ""
        self.inside = False
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[str | ToolCall]:
        """Returns, in order, content strings and complete tool calls made visible by `text`."""
        self.buffer += text
        out: list[str | ToolCall] = []
        while True:
            if not self.inside:
                i = self.buffer.find(OPEN)
                if i == -1:
                    keep = _partial_tag_suffix(self.buffer, OPEN)
                    visible, self.buffer = (
                        self.buffer[: len(self.buffer) - keep],
                        self.buffer[len(self.buffer) - keep :],
                    )
                    if visible:
                        out.append(visible)
                    return out
                if i:
                    out.append(self.buffer[:i])
                self.buffer, self.inside = self.buffer[i + len(OPEN) :], True
            else:
                j = self.buffer.find(CLOSE)
                if j == -1:
                    return out
                body, self.buffer, self.inside = self.buffer[:j], self.buffer[j + len(CLOSE) :], False
                call = parse_call(body.strip())
                if call is None:
                    out.append(OPEN + body + CLOSE)
                else:
                    self.calls.append(call)
                    out.append(call)

    def finish(self) -> list[str | ToolCall]:
        """At the end of the output: an unterminated call is tried as JSON, else shown as text."""
        rest, self.buffer = self.buffer, ""
        if not rest:
            return []
        if self.inside:
            self.inside = False
            call = parse_call(rest.strip())
            if call is not None:
                self.calls.append(call)
                return [call]
            return [OPEN + rest]
        return [rest]
