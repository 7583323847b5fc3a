"""Structured output at the gateway: `response_format`, a forced `tool_choice` and vLLM's
`structured_outputs` become the grammar spec the replica compiles; what is cheap to check is a
400 naming the parameter here (the replica's compile errors are tested in tests/engine and
through the stack in tests/integration/test_structured_serving.py)."""

import pytest

from controlplane.gateway.core.errors import OpenAIError
from controlplane.gateway.dialects.openai.request import parse_chat, parse_completion

MSG = [{"role": "user", "content": "hi"}]
CHAT = {"model": "m", "messages": MSG}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "now"}},
]


def grammar(body: dict, parse=parse_chat):
    return parse(body).params.grammar


def test_response_format_becomes_a_json_grammar():
    assert grammar({**CHAT, "response_format": {"type": "text"}}) is None
    assert grammar(CHAT) is None
    assert grammar({**CHAT, "response_format": {"type": "json_object"}}) == {"type": "json_object"}
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
    assert grammar({**CHAT, "response_format": fmt}) == {"type": "json_schema", "schema": SCHEMA}
    no_schema = {"type": "json_schema", "json_schema": {"name": "anything"}}
    assert grammar({**CHAT, "response_format": no_schema}) == {"type": "json_schema", "schema": {}}
    # It travels to the replica in the sampling parameters.
    req = parse_chat({**CHAT, "response_format": fmt})
    assert req.replica_message().to_wire()["params"]["grammar"] == {"type": "json_schema", "schema": SCHEMA}


def test_a_forced_tool_choice_becomes_a_tool_call_grammar():
    required = grammar({**CHAT, "tools": TOOLS, "tool_choice": "required"})
    assert required == {
        "type": "tool_call",
        "tools": [{"name": "get_weather", "parameters": SCHEMA}, {"name": "now", "parameters": {}}],
    }
    named = grammar({**CHAT, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "now"}}})
    assert named == {"type": "tool_call", "tools": [{"name": "now", "parameters": {}}]}
    assert grammar({**CHAT, "tools": TOOLS, "tool_choice": "auto"}) is None
    assert grammar({**CHAT, "tools": TOOLS, "tool_choice": "none"}) is None


def test_structured_outputs_take_vllms_spelling_on_both_endpoints():
    for parse, body in ((parse_chat, CHAT), (parse_completion, {"model": "m", "prompt": "hi"})):
        assert grammar({**body, "structured_outputs": {"regex": "[a-z]+"}}, parse) == {
            "type": "regex",
            "regex": "[a-z]+",
        }
        assert grammar({**body, "structured_outputs": {"choice": ["a", "b"]}}, parse) == {
            "type": "choice",
            "choice": ["a", "b"],
        }
        assert grammar({**body, "structured_outputs": {"grammar": 'root ::= "x"'}}, parse) == {
            "type": "grammar",
            "grammar": 'root ::= "x"',
        }
        assert grammar({**body, "structured_outputs": {"json": SCHEMA}}, parse) == {
            "type": "json_schema",
            "schema": SCHEMA,
        }
        as_text = {"json": '{"type": "integer"}', "regex": None}
        assert grammar({**body, "structured_outputs": as_text}, parse) == {
            "type": "json_schema",
            "schema": {"type": "integer"},
        }


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"response_format": {"type": "yaml"}}, "response_format.type", "'json_schema'"),
        ({"response_format": "json"}, "response_format", "must be an object"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "'name' and 'schema'"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
         "response_format.json_schema.name", "non-empty string"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}},
         "response_format.json_schema.schema", "JSON schema object"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": "yes"}}},
         "response_format.json_schema.strict", "boolean"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice.function.name", '"nope", which is not in \'tools\' (get_weather, now)'),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}], "tool_choice": "required"},
         "tools[0].function.parameters", "JSON schema object"),
        ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex", "not a valid regular expression"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "non-empty list"),
        ({"structured_outputs": {"choice": ["a", 1]}}, "structured_outputs.choice", "non-empty list"),
        ({"structured_outputs": {"grammar": " "}}, "structured_outputs.grammar", "EBNF"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json", "JSON schema"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one"),
        ({"structured_outputs": {}}, "structured_outputs", "exactly one"),
        ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag", "not supported"),
        ({"structured_outputs": "json"}, "structured_outputs", "must be an object"),
        ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
         "structured_outputs", "both constrain the output"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
         "response_format", "both constrain the output"),
    ],
)  # fmt: skip
def test_what_the_gateway_can_check_is_a_400_naming_the_parameter(extra, param, words):
    with pytest.raises(OpenAIError) as err:
        parse_chat({**CHAT, **extra})
    assert err.value.status == 400 and err.value.param == param
    assert words in err.value.message


def test_response_format_is_a_chat_parameter():
    with pytest.raises(OpenAIError) as err:
        parse_completion({"model": "m", "prompt": "hi", "response_format": {"type": "json_object"}})
    assert err.value.code == "unknown_parameter"
