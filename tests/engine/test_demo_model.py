"""The demo model: the committed checkpoint is what the recipe makes, and the recipe runs."""

import json

from workers.demo import MODEL_DIR
from workers.demo.corpus import conversations, tool_schemas
from workers.demo.train import HERE, assistant_mask, main
from workers.engine import LLM, SamplingParams
from workers.engine.tokenizer import Tokenizer


def test_committed_demo_model_is_small_and_speaks():
    weights = MODEL_DIR / "model.safetensors"
    assert weights.stat().st_size <= 20 << 20
    assert (MODEL_DIR / "chat_template.jinja").read_text() == (HERE / "chat_template.jinja").read_text()
    assert json.loads((MODEL_DIR / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    llm = LLM(model=str(MODEL_DIR), device="cpu", dtype="float32")
    greedy = SamplingParams(temperature=0.0, max_tokens=40)
    answer = llm.chat([{"role": "user", "content": "What is the capital of Peru?"}], greedy)[0].outputs[0]
    assert answer.text == "The capital of Peru is Lima." and answer.finish_reason == "stop"
    call = llm.chat([{"role": "user", "content": "Weather in Rome please."}], greedy, tools=tool_schemas())
    text = call[0].outputs[0].text
    assert text.startswith("<tool_call>") and text.endswith("</tool_call>")
    assert json.loads(text.removeprefix("<tool_call>").removesuffix("</tool_call>")) == {
        "name": "get_weather",
        "arguments": {"city": "Rome"},
    }
    # Asked for something only a tool can do, with no tools offered, it says so.
    bare = llm.chat([{"role": "user", "content": "What time is it in Seoul?"}], greedy)[0].outputs[0]
    assert bare.text == "I need a tool for that, and none is available."


def test_corpus_is_seeded_and_mixes_tool_calls_with_answers():
    assert conversations(50, seed=3) == conversations(50, seed=3)
    assert conversations(50, seed=3) != conversations(50, seed=4)
    chats = conversations(400)
    with_calls = [m for m, _ in chats if any(msg.get("tool_calls") for msg in m)]
    assert 0.3 < len(with_calls) / len(chats) < 0.7
    assert all(tools is not None for m, tools in chats if m in with_calls)


def test_assistant_mask_covers_only_assistant_turns():
    # <|user|> hi <|end|> <|assistant|> ok . <|end|>
    user, end, assistant = 3, 1, 4
    ids = [user, 10, end, assistant, 11, 12, end]
    assert assistant_mask(ids, assistant, end) == [False, False, False, False, True, True, True]


def test_recipe_trains_a_loadable_hf_directory(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["--out", str(out), "--steps", "2", "--batch", "4", "--conversations", "200", "--vocab", "400"]) == 0
    assert "saved" in capsys.readouterr().out
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    tok = Tokenizer(out)
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=tool_schemas())
    rendered = tok.decode(ids, skip_special_tokens=False)
    assert rendered.startswith("<|system|>Tools: get_weather(city), get_time(city)")
    assert rendered.endswith("<|user|>hi<|end|>\n<|assistant|>")
    # The tool-call tags are plain text to the detokenizer, so the gateway can find them.
    assert tok.decode(tok.encode("<tool_call>{}</tool_call>")) == "<tool_call>{}</tool_call>"
    out_ids = LLM(model=str(out), device="cpu").generate([ids], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(out_ids[0].outputs[0].token_ids) == 3
