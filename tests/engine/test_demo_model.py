"""The demo model: the committed checkpoint is what the recipe makes, and the recipe runs."""

import json
import random

import pytest

from workers.demo import MODEL_DIR
from workers.demo.corpus import (
    MISSING_TOOL_ANSWER,
    NO_TOOL_ANSWER,
    conversations,
    decoy_tools,
    tool_schema,
    tool_schemas,
)
from workers.demo.train import DECISION_WEIGHT, HERE, assistant_mask, loss_weights, main
from workers.engine import LLM, SamplingParams
from workers.protocol.tokenizer import Tokenizer

GREEDY = SamplingParams(temperature=0.0, max_tokens=60)
# A question per tool, with the arguments the call must carry.
ASKS = {
    "get_weather": ("What is the weather in Lima?", {"city": "Lima"}),
    "get_time": ("What time is it in Oslo?", {"city": "Oslo"}),
    "convert_currency": ("Convert 20 EUR to JPY.", {"amount": 20, "source": "EUR", "target": "JPY"}),
    "create_ticket": ("Open a high priority ticket about login.", {"topic": "login", "priority": "high"}),
    "search_docs": ("Search the docs for quota.", {"query": "quota"}),
}
TOOLS = {t["function"]["name"]: t for t in tool_schemas()}
# A tool the corpus never shows: callers offer their own tools beside the demo's.
UNRELATED = tool_schema("lookup_order", "Find an order", order_id="string")


@pytest.fixture(scope="module")
def demo_llm():
    return LLM(model=str(MODEL_DIR), device="cpu", dtype="float32")


def answers(llm: LLM, cases: list[tuple[str, list[dict] | None]]) -> list[str]:
    """Greedy answers to (question, tools) cases, all in one batch."""
    prompts = [
        {"prompt_token_ids": llm.tokenizer.apply_chat_template([{"role": "user", "content": q}], tools=tools)}
        for q, tools in cases
    ]
    return [out.outputs[0].text for out in llm.generate(prompts, GREEDY)]


def parse_call(text: str) -> dict:
    assert text.startswith("<tool_call>") and text.endswith("</tool_call>"), text
    return json.loads(text.removeprefix("<tool_call>").removesuffix("</tool_call>"))


def names(tools: list[dict]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def test_committed_demo_model_is_small_and_speaks(demo_llm):
    weights = MODEL_DIR / "model.safetensors"
    assert weights.stat().st_size <= 20 << 20
    assert (MODEL_DIR / "chat_template.jinja").read_text() == (HERE / "chat_template.jinja").read_text()
    assert json.loads((MODEL_DIR / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    answer = demo_llm.chat([{"role": "user", "content": "What is the capital of Peru?"}], GREEDY)[0].outputs[0]
    assert answer.text == "The capital of Peru is Lima." and answer.finish_reason == "stop"
    call = demo_llm.chat([{"role": "user", "content": "Weather in Rome please."}], GREEDY, tools=tool_schemas())
    assert parse_call(call[0].outputs[0].text) == {"name": "get_weather", "arguments": {"city": "Rome"}}
    # Asked for something only a tool can do, with no tools offered, it says so.
    bare = demo_llm.chat([{"role": "user", "content": "What time is it in Seoul?"}], GREEDY)[0].outputs[0]
    assert bare.text == NO_TOOL_ANSWER


def test_demo_model_calls_its_tool_in_any_subset_and_order(demo_llm):
    rng = random.Random(12)
    cases = []
    for name, (question, _) in ASKS.items():
        tool = TOOLS[name]
        offers = [[tool], [tool, UNRELATED], [UNRELATED, tool]]
        for _ in range(4):
            others = [t for t in tool_schemas() if t["function"]["name"] != name]
            subset = [*rng.sample(others, rng.randint(0, 4)), tool, *decoy_tools(rng, rng.randint(0, 2))]
            rng.shuffle(subset)
            offers.append(subset)
        cases += [(name, question, offered) for offered in offers]
    texts = answers(demo_llm, [(q, offered) for _, q, offered in cases])
    for (name, question, offered), text in zip(cases, texts, strict=True):
        assert parse_call(text) == {"name": name, "arguments": ASKS[name][1]}, (question, names(offered))


def test_demo_model_does_not_call_a_tool_that_was_not_offered(demo_llm):
    rng = random.Random(21)
    cases = []
    for name, (question, _) in ASKS.items():
        others = [t for t in tool_schemas() if t["function"]["name"] != name]
        offers = [[UNRELATED], [rng.choice(others)]]
        for _ in range(4):
            subset = rng.sample(others, rng.randint(1, 4)) + decoy_tools(rng, rng.randint(0, 1))
            rng.shuffle(subset)
            offers.append(subset)
        cases += [(question, offered) for offered in offers]
    for (question, offered), text in zip(cases, answers(demo_llm, cases), strict=True):
        assert "<tool_call>" not in text, (question, names(offered), text)
        assert text == MISSING_TOOL_ANSWER, (question, names(offered))


def test_demo_model_answers_questions_whatever_tools_are_offered(demo_llm):
    questions = {"What is the capital of Japan?": "The capital of Japan is Tokyo.", "Say hello.": "Hello!"}
    offers = [None, tool_schemas(), [TOOLS["get_time"]], [UNRELATED, TOOLS["search_docs"]]]
    cases = [(q, offered) for q in questions for offered in offers]
    for (question, offered), text in zip(cases, answers(demo_llm, cases), strict=True):
        assert text == questions[question], (names(offered or []), text)


def test_corpus_is_seeded_and_offers_tools_in_any_subset_and_order():
    assert conversations(50, seed=3) == conversations(50, seed=3)
    assert conversations(50, seed=3) != conversations(50, seed=4)
    chats = conversations(2000)
    calls = [(m, tools) for m, tools in chats if any(msg.get("tool_calls") for msg in m)]
    assert 0.25 < len(calls) / len(chats) < 0.5
    for m, tools in calls:  # a call is only ever to a tool that was offered
        assert m[1]["tool_calls"][0]["function"]["name"] in names(tools)
    offered = [names(tools) for _, tools in chats if tools]
    assert all(offered)
    assert {len(o) for o in offered} >= set(range(1, 8))
    assert len({tuple(o) for o in offered}) > 500  # many subsets, many orders
    refused = [(m, tools) for m, tools in chats if m[-1]["content"] == MISSING_TOOL_ANSWER]
    assert refused and all(tools for _, tools in refused)
    assert any(tools is None for m, tools in chats if m[-1]["content"] == NO_TOOL_ANSWER)


def test_assistant_mask_covers_only_assistant_turns():
    # <|user|> hi <|end|> <|assistant|> ok . <|end|>
    user, end, assistant = 3, 1, 4
    ids = [user, 10, end, assistant, 11, 12, end]
    assert assistant_mask(ids, assistant, end) == [False, False, False, False, True, True, True]


def test_loss_weighs_the_first_token_of_each_assistant_turn_most():
    # <|user|> hi <|end|> <|assistant|> ok . <|end|> <|tool|> x <|end|> <|assistant|> y <|end|>
    user, end, assistant, tool = 3, 1, 4, 5
    ids = [user, 10, end, assistant, 11, 12, end, tool, 13, end, assistant, 14, end]
    w = DECISION_WEIGHT
    assert loss_weights(ids, assistant, end) == [0, 0, 0, 0, w, 1, 1, 0, 0, 0, 0, w, 1]


def test_recipe_trains_a_loadable_hf_directory(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["--out", str(out), "--steps", "2", "--batch", "4", "--conversations", "200", "--vocab", "400"]) == 0
    assert "saved" in capsys.readouterr().out
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    tok = Tokenizer(out)
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=tool_schemas())
    rendered = tok.decode(ids, skip_special_tokens=False)
    assert rendered.startswith("<|system|>Tools: get_weather(city), get_time(city)")
    assert rendered.endswith("<|user|>hi<|end|>\n<|assistant|>")
    # The tool-call tags are plain text to the detokenizer, so the gateway can find them.
    assert tok.decode(tok.encode("<tool_call>{}</tool_call>")) == "<tool_call>{}</tool_call>"
    out_ids = LLM(model=str(out), device="cpu").generate([ids], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(out_ids[0].outputs[0].token_ids) == 3
