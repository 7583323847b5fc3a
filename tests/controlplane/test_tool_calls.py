"""Tool calls that cannot be split: the gateway's parser reads a call's JSON (strings and escapes
included) so a `</tool_call>` inside an argument does not end it; a forced call comes back as a
call in every API, streamed or not (the real engine writes such an argument under a forced
call's grammar); and tool definitions are checked whatever the `tool_choice`."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.gateway.tool_calls import CLOSE, OPEN, ToolCall, ToolCallParser

TRICKY = '</tool_call> <tool_call> \\ " { } [ ] < > / tool_call'  # what a string may hold that looks like structure


def feed_all(parser: ToolCallParser, pieces) -> list:
    out = []
    for piece in pieces:
        out += parser.feed(piece)
    return out + parser.finish()


def split(out: list) -> tuple[str, list[ToolCall]]:
    return "".join(p for p in out if isinstance(p, str)), [p for p in out if isinstance(p, ToolCall)]


def forced(name: str, arguments: dict) -> str:
    """A call as a forced call's grammar writes it (workers/engine/structured.py): compact JSON."""
    return f"{OPEN}{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}{CLOSE}"


# -- the parser ------------------------------------------------------------------------------------
def test_a_close_tag_inside_an_argument_does_not_end_the_call_wherever_the_text_is_cut():
    arguments = {"html": "<b>x</b></tool_call>", "quoted": 'say "</tool_call>" \\', "tail": "}}</tool_call>"}
    text = forced("render", arguments)
    cuts = [[text[:i], text[i:]] for i in range(len(text) + 1)]
    cuts += [[text[i : i + size] for i in range(0, len(text), size)] for size in (1, 2, 3, 5, 7, 11)]
    for pieces in cuts:
        content, calls = split(feed_all(ToolCallParser(), pieces))
        assert content == "", pieces
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [("render", arguments)], pieces


@settings(max_examples=200, deadline=None)
@given(
    before=st.text(alphabet="ab <>/_\n", max_size=12).filter(lambda t: OPEN not in t),
    calls=st.lists(st.dictionaries(st.sampled_from("xyz"), st.text(alphabet=TRICKY, max_size=30)), min_size=1,
                   max_size=3),
    cuts=st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=40),
)  # fmt: skip
def test_any_arguments_cut_anywhere_come_back_whole(before, calls, cuts):
    text = before + "\n".join(forced(f"f{i}", args) for i, args in enumerate(calls))
    pieces, at = [], 0
    for n in cuts * (len(text) // sum(cuts) + 1):
        pieces.append(text[at : at + n])
        at += n
    content, found = split(feed_all(ToolCallParser(), pieces))
    assert content == before + "\n" * (len(calls) - 1)
    assert [(c.name, json.loads(c.arguments)) for c in found] == [(f"f{i}", a) for i, a in enumerate(calls)]


def test_text_before_a_call_is_shown_at_once_and_the_call_when_it_closes():
    parser = ToolCallParser()
    assert parser.feed("Let me check. <tool_c") == ["Let me check. "]  # the tag's start is held back
    assert parser.feed('all>{"name": "f", "arguments": {"s": "</tool_call>') == []
    assert parser.feed('"}}</tool_') == []
    (call,) = parser.feed("call>Done.")[:1]
    assert (call.name, json.loads(call.arguments)) == ("f", {"s": "</tool_call>"})
    assert parser.finish() == [] and parser.calls == [call]
    parser = ToolCallParser()
    assert [p.name for p in parser.feed(forced("f", {}) + "Done.")[:1]] == ["f"]


def test_a_close_tag_outside_the_json_ends_a_broken_call_as_text_and_later_calls_still_count():
    broken = '<tool_call>{"name": "a", "arguments": {"x": 1}</tool_call>'  # one brace short
    parser = ToolCallParser()
    assert parser.feed(broken) == [broken]  # shown when its tag arrives, not held to the end
    content, calls = split(parser.feed(" then " + forced("b", {"y": 2})) + parser.finish())
    assert content == " then " and [c.name for c in calls] == ["b"]
    # Text after the object and before the tag: not a call either; everything is shown.
    junk = '<tool_call>{"name": "a", "arguments": {}} and more</tool_call>'
    assert "".join(feed_all(ToolCallParser(), [junk, "x"])) == junk + "x"


def test_at_the_end_a_complete_object_is_a_call_and_anything_else_is_text():
    content, calls = split(feed_all(ToolCallParser(), ['<tool_call>{"name": "f", "arguments": {}}</tool_']))
    assert content == "" and [c.name for c in calls] == ["f"]  # max_tokens cut the closing tag
    cut = '<tool_call>{"name": "f", "arguments": {"s": "</tool_call> and'
    assert feed_all(ToolCallParser(), [cut]) == [cut]  # a string never closed: nothing is lost
