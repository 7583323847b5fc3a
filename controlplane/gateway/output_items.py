"""A model's answer as the ordered items the agent APIs speak: runs of text and tool calls.

OpenAI's Responses API answers with output items (a `message`, a `function_call`...) and
Anthropic's Messages API with content blocks (`text`, `tool_use`); both stream an item as it
opens, grows and closes. `OutputItems` turns replica deltas (through the chat endpoint's tool-call
parser) into those changes, once, for both APIs and both response styles.

Whitespace at the end of the text so far is held back until more text follows: a newline
before a tool call opens no text item nor ends one, and whitespace after the last call is
dropped; a plain answer keeps every character.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.gateway.core import GenerationRequest
from controlplane.gateway.tool_calls import ChatShaper, ToolCall
from workers.protocol.replica import DeltaEvent


@dataclass
class Text:
    parts: list[str] = field(default_factory=list)
    closed: bool = False

    @property
    def text(self) -> str:
        return "".join(self.parts)


@dataclass(frozen=True)
class Opened:
    index: int


@dataclass(frozen=True)
class Grew:
    index: int
    text: str


@dataclass(frozen=True)
class Closed:
    index: int


@dataclass(frozen=True)
class Called:
    index: int
    call: ToolCall


Change = Opened | Grew | Closed | Called


class OutputItems:
    def __init__(self, req: GenerationRequest):
        self.shaper = ChatShaper(req)
        self.items: list[Text | ToolCall] = []
        self.pending = ""  # trailing whitespace not yet shown: it may only precede a tool call

    @property
    def calls(self) -> list[ToolCall]:
        return [item for item in self.items if isinstance(item, ToolCall)]

    def _open_text(self) -> Text | None:
        last = self.items[-1] if self.items else None
        return last if isinstance(last, Text) and not last.closed else None

    def _close(self, out: list[Change]) -> None:
        text = self._open_text()
        if text is not None:
            text.closed = True
            out.append(Closed(len(self.items) - 1))

    def _text(self, piece: str, out: list[Change], force: bool = False) -> None:
        """Show `piece` but its trailing whitespace, which waits for more text (`force`: shown)."""
        piece = self.pending + piece
        shown = piece if force else piece.rstrip()
        self.pending = piece[len(shown) :]
        if not shown:
            return
        text = self._open_text()
        if text is None:
            text = Text()
            self.items.append(text)
            out.append(Opened(len(self.items) - 1))
        text.parts.append(shown)
        out.append(Grew(len(self.items) - 1, shown))

    def feed(self, event: DeltaEvent) -> list[Change]:
        """The changes `event` makes; the final event closes every item."""
        out: list[Change] = []
        for piece in self.shaper.pieces(event):
            if isinstance(piece, ToolCall):
                self._close(out)
                self.pending = ""
                self.items.append(piece)
                out.append(Called(len(self.items) - 1, piece))
            elif piece:
                self._text(piece, out)
        if event.final:
            if self.pending and not self.calls:  # a plain answer keeps its trailing whitespace
                self._text("", out, force=True)
            self._close(out)
        return out
