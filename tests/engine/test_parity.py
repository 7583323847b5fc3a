"""The engine's greedy tokens and logprobs equal transformers' on every supported family."""

import pytest
import torch
import transformers

from workers.engine import LLM, SamplingParams

PROMPTS = [[5, 9, 33, 100, 7, 8, 9, 10, 11], [3, 4], list(range(20, 70))]
MAX_TOKENS = 10


def reference(model_dir, prompt):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=MAX_TOKENS,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        eos_token_id=None,
        pad_token_id=0,
    )
    tokens = out.sequences[0, len(prompt) :].tolist()
    logprobs = [torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(out.logits, tokens, strict=True)]
    return tokens, logprobs


@pytest.mark.parametrize("arch", ["llama", "llama3_rope", "llama_tied", "mistral", "qwen2", "qwen3"])
def test_greedy_tokens_and_logprobs_match_transformers(checkpoint_factory, arch):
    model_dir = checkpoint_factory(arch)
    llm = LLM(str(model_dir), device="cpu", dtype="float32", block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=1, ignore_eos=True)
    first = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    # The same prompts again: now every full prompt block is a prefix-cache hit.
    again = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    assert again[2].num_cached_tokens >= 44
    for prompt, out, cached in zip(PROMPTS, first, again, strict=True):
        ref_tokens, ref_logprobs = reference(model_dir, prompt)
        for result in (out, cached):
            comp = result.outputs[0]
            assert comp.token_ids == ref_tokens
            mine = [comp.logprobs[i][t] for i, t in enumerate(comp.token_ids)]
            assert max(abs(a - b) for a, b in zip(mine, ref_logprobs, strict=True)) < 1e-3
            assert comp.finish_reason == "length"


def test_logprobs_hold_top_n_and_the_sampled_token(llama_dir):
    llm = LLM(str(llama_dir), device="cpu", dtype="float32")
    out = llm.generate(
        {"prompt_token_ids": [1, 2, 3]},
        SamplingParams(temperature=1.0, seed=3, max_tokens=6, logprobs=3, ignore_eos=True),
    )[0]
    comp = out.outputs[0]
    assert len(comp.logprobs) == len(comp.token_ids) == 6
    for token, entry in zip(comp.token_ids, comp.logprobs, strict=True):
        assert token in entry
        assert 3 <= len(entry) <= 4
        assert all(v <= 0 for v in entry.values())
