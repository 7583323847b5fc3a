"""The gateway's pure parts: OpenAI request validation and the streaming tool-call parser."""

import json

import pytest

from controlplane.gateway.core.body import parse_json
from controlplane.gateway.core.errors import OpenAIError
from controlplane.gateway.dialects.openai.request import parse_chat, parse_completion
from controlplane.gateway.tool_calls import ToolCall, ToolCallParser

MSG = [{"role": "user", "content": "hi"}]


def test_chat_request_maps_openai_fields_to_engine_params():
    req = parse_chat(
        {
            "model": "demo",
            "messages": [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]}, *MSG],
            "temperature": 0,
            "top_p": 0.5,
            "seed": 7,
            "stop": "END",
            "max_completion_tokens": 9,
            "max_tokens": 99,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "logprobs": True,
            "top_logprobs": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    assert req.messages[0] == {"role": "system", "content": "be brief"}
    p = req.params
    assert (p.temperature, p.top_p, p.seed, p.stop, p.max_tokens) == (0, 0.5, 7, ["END"], 9)
    assert (p.presence_penalty, p.frequency_penalty, p.logprobs) == (0.5, -0.5, 3)
    assert req.stream and req.include_usage
    message = req.replica_message()
    assert message.messages == req.messages and message.tools is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": MSG}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": MSG, "temperature": True}, "temperature"),
        ({"model": "m", "messages": MSG, "temperature": 3}, "temperature"),
        ({"model": "m", "messages": MSG, "max_tokens": 1.5}, "max_tokens"),
        ({"model": "m", "messages": MSG, "stop": [1]}, "stop"),
        ({"model": "m", "messages": MSG, "n": 17}, "n"),
        ({"model": "m", "messages": MSG, "n": 0}, "n"),
        ({"model": "m", "messages": MSG, "n": True}, "n"),
        ({"model": "m", "messages": MSG, "n": 2, "seed": 2**64 - 1}, "seed"),
        ({"model": "m", "messages": MSG, "logit_bias": {"x": 1}}, "logit_bias"),
        ({"model": "m", "messages": MSG, "logit_bias": {"-1": 1}}, "logit_bias"),
        ({"model": "m", "messages": MSG, "logit_bias": {"5": 100.5}}, "logit_bias"),
        ({"model": "m", "messages": MSG, "logit_bias": {"5": "1"}}, "logit_bias"),
        ({"model": "m", "messages": MSG, "logit_bias": {"5": True}}, "logit_bias"),
        ({"model": "m", "messages": MSG, "logit_bias": [5]}, "logit_bias"),
        ({"model": "m", "messages": MSG, "logit_bias": {str(i): 1 for i in range(1025)}}, "logit_bias"),
        ({"model": "m", "messages": MSG, "top_logprobs": 2}, "top_logprobs"),
        ({"model": "m", "messages": MSG, "tool_choice": "required"}, "tool_choice"),
        ({"model": "m", "messages": MSG, "tools": [{"type": "function"}]}, "tools"),
        ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ],
)
def test_chat_request_errors_name_the_parameter(body, param):
    with pytest.raises(OpenAIError) as err:
        parse_chat(body)
    assert err.value.status == 400 and err.value.param == param
    assert set(err.value.body()["error"]) == {"message", "type", "param", "code"}


def test_completion_prompt_forms_and_errors():
    assert parse_completion({"model": "m", "prompt": "x"}).replica_message().prompt == "x"
    assert parse_completion({"model": "m", "prompt": [[1, 2, 3]]}).replica_message().prompt_token_ids == [1, 2, 3]
    assert parse_completion({"model": "m", "prompt": "x"}).params.max_tokens == 16  # OpenAI's default
    for prompt in ("", [], ["a", "b"], [1, "x"], None):
        with pytest.raises(OpenAIError) as err:
            parse_completion({"model": "m", "prompt": prompt})
        assert err.value.param == "prompt"
    with pytest.raises(OpenAIError) as err:
        parse_json(b"[1, 2]")
    assert err.value.code == "invalid_json"


def feed_all(parser: ToolCallParser, pieces: list[str]) -> list:
    out = []
    for p in pieces:
        out += parser.feed(p)
    return out + parser.finish()


def test_tool_calls_are_found_across_arbitrary_chunk_boundaries():
    text = 'Sure.<tool_call>{"name": "get_time", "arguments": {"city": "Oslo"}}</tool_call>'
    for size in (1, 3, 7, len(text)):
        parser = ToolCallParser()
        out = feed_all(parser, [text[i : i + size] for i in range(0, len(text), size)])
        content = "".join(p for p in out if isinstance(p, str))
        calls = [p for p in out if isinstance(p, ToolCall)]
        assert content == "Sure."
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_time", {"city": "Oslo"})]
        assert calls[0].id.startswith("call_")


def test_text_that_only_looks_like_a_tag_is_not_lost():
    parser = ToolCallParser()
    out = feed_all(parser, ["a <tool", "_c", "x> b"])
    assert "".join(out) == "a <tool_cx> b"
    parser = ToolCallParser()
    out = feed_all(parser, ["<tool_call>not json</tool_call>", '<tool_call>{"name": "x"'])
    assert [p if isinstance(p, str) else p.name for p in out] == [
        "<tool_call>not json</tool_call>",
        '<tool_call>{"name": "x"',
    ]


def test_two_calls_and_an_unterminated_one_at_the_end():
    parser = ToolCallParser()
    out = feed_all(parser, ['<tool_call>{"name": "a", "arguments": {}}</tool_call>\n', '<tool_call>{"name": "b"}'])
    assert [p.name for p in out if isinstance(p, ToolCall)] == ["a", "b"]
    assert [p.name for p in parser.calls] == ["a", "b"]


def test_n_and_logit_bias_reach_the_replica_message():
    req = parse_chat({"model": "m", "messages": MSG, "n": 16, "seed": 3, "logit_bias": {"50": -100, "007": 2.5}})
    assert (req.params.n, req.params.logit_bias) == (16, {"50": -100.0, "7": 2.5})
    wire = req.replica_message().to_wire()["params"]
    assert wire["n"] == 16 and wire["logit_bias"] == {"50": -100.0, "7": 2.5}
    req = parse_completion({"model": "m", "prompt": "x", "n": 3, "logit_bias": {}})
    assert (req.params.n, req.params.logit_bias) == (3, None)
    assert parse_completion({"model": "m", "prompt": "x"}).params.n == 1


def test_n_past_the_limit_names_the_limit():
    with pytest.raises(OpenAIError) as err:
        parse_completion({"model": "m", "prompt": "x", "n": 17})
    assert err.value.status == 400 and err.value.param == "n" and "at most 16" in err.value.message


def test_the_delta_event_carries_its_choice_index():
    from workers.protocol.replica import DeltaEvent

    event = DeltaEvent("r", "x", [1], index=2)
    assert DeltaEvent.from_wire(json.loads(json.dumps(event.to_wire()))).index == 2
    assert "index" not in DeltaEvent("r", "x", [1]).to_wire()  # choice 0: as before
    assert DeltaEvent.from_wire(DeltaEvent("r", "x", [1]).to_wire()).index == 0
