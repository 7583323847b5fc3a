"""Tokenizer, chat templates (against transformers) and incremental detokenisation."""

import pytest
import transformers

from workers.engine import LLM, SamplingParams
from workers.protocol.tokenizer import IncrementalDetokenizer, TemplateError, Tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Météo à Paris? 🚀"}]


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_chat_template_renders_as_transformers_does(llama_dir, tools):
    ours = Tokenizer(llama_dir)
    theirs = transformers.AutoTokenizer.from_pretrained(str(llama_dir))
    expected = theirs.apply_chat_template(MESSAGES, tools=tools, tokenize=False, add_generation_prompt=True)
    assert ours.render_chat(MESSAGES, tools=tools) == expected
    ids = theirs.apply_chat_template(MESSAGES, tools=tools, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    assert ours.apply_chat_template(MESSAGES, tools=tools) == list(ids)


def test_template_raise_exception_is_a_clear_error(llama_dir):
    tok = Tokenizer(llama_dir)
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(TemplateError, match="roles must alternate"):
        tok.render_chat(MESSAGES)


def test_template_sandbox_blocks_attribute_escape(llama_dir):
    tok = Tokenizer(llama_dir)
    tok.chat_template = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(TemplateError):
        tok.render_chat(MESSAGES)


def test_incremental_detokenisation_equals_full_decode_for_multibyte_text(llama_dir):
    tok = Tokenizer(llama_dir)
    text = "Unicode: naïve café, 東京, emoji 🚀🙂 and more ✓."
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, [])
    pieces = [detok.add(t) for t in ids]
    assert "".join(pieces) == tok.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)
    # Some character really spans several tokens, so holding back was exercised.
    assert "" in pieces


def test_stop_string_split_across_tokens_truncates_and_is_never_streamed(llama_dir):
    llm = LLM(str(llama_dir))
    probe = llm.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    text = probe[0].outputs[0].text
    ids = probe[0].outputs[0].token_ids
    # Choose a stop string that straddles the boundary of two generated tokens.
    pieces = [llm.tokenizer.decode(ids[:i]) for i in range(len(ids) + 1)]
    cut = next(
        i
        for i in range(2, len(ids))
        if len(pieces[i]) - len(pieces[i - 1]) >= 1 and len(pieces[i + 1]) > len(pieces[i])
    )
    stop = pieces[cut][-1] + pieces[cut + 1][len(pieces[cut]) :][:1]
    start = text.find(stop)
    engine = llm.engine
    engine.add_request("s", [5, 6, 7], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop]))
    streamed, last = "", None
    while engine.has_unfinished_requests():
        for d in engine.step():
            streamed += d.new_text
            last = d
    assert last.finish_reason == "stop" and last.stop_reason == stop
    assert streamed == text[:start]
    assert stop not in streamed


def test_text_prompt_and_chat(llama_dir):
    llm = LLM(str(llama_dir))
    out = llm.generate("The quick brown fox", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    assert out.prompt_token_ids == llm.tokenizer.encode("The quick brown fox")
    assert len(out.outputs[0].token_ids) == 5
    chat = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), tools=TOOLS)[0]
    assert chat.prompt_token_ids == llm.tokenizer.apply_chat_template(MESSAGES, tools=TOOLS)
