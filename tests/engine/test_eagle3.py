"""EAGLE-3 drafting: lossless on random target/head pairs of every family and on the demo pair,
drafts identical to what the trainer's unrolled head predicts, and heads that do not fit (or are
broken) refused with a clear error."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.engine.checkpoints import build_eagle3_head
from tests.engine.test_speculative_decode import GREEDY, PROMPTS, assert_consistent, assert_same, generate
from workers.draft_training.train_eagle3 import TargetFeatures, unroll
from workers.engine import LLM, SamplingParams
from workers.engine.config import rope_from
from workers.engine.errors import ModelLoadError, RequestError
from workers.engine.speculative import SpeculativeConfig
from workers.engine.speculative.eagle3 import NORMS, DraftPass, Eagle3Head, fold_norm_weights
from workers.protocol.draft_models import read_eagle3

ARCHS = ["llama", "mistral", "qwen2", "qwen3", "deepseek_v3", "kimi_k2"]
DEMO_MODEL = "workers/demo/model"
DEMO_DRAFT = "workers/demo/draft"


def eagle(model_dir, head_dir, k: int = 3, **kwargs) -> LLM:
    kwargs.setdefault("block_size", 4)
    spec = {"method": "eagle3", "model": str(head_dir), "num_speculative_tokens": k, **kwargs.pop("spec", {})}
    return LLM(str(model_dir), device="cpu", dtype="float32", speculative_config=spec, **kwargs)


def plain(model_dir, **kwargs) -> LLM:
    kwargs.setdefault("block_size", 4)
    return LLM(str(model_dir), device="cpu", dtype="float32", **kwargs)


@pytest.mark.parametrize("arch", ARCHS)
def test_random_head_is_lossless_alone_together_and_under_preemption(checkpoint_factory, tmp_path, arch):
    """A random head's drafts are nearly all rejected: every step rolls back, and tokens and
    logprobs still equal the plain engine's, with the block manager's books balanced."""
    model_dir = checkpoint_factory(arch)
    head = build_eagle3_head(tmp_path / "head", model_dir, draft_vocab_size=96 if arch == "qwen2" else None)
    want = [generate(plain(model_dir), [p], GREEDY)[0] for p in PROMPTS]
    every_step = {"disable_by_batch_size": 8, "draft_backoff": 0}  # draft and roll back at every step
    spec = eagle(model_dir, head, spec=every_step)
    for p, w in zip(PROMPTS, want, strict=True):
        assert_same(generate(spec, [p], GREEDY)[0], w)
    for got, w in zip(generate(spec, PROMPTS, GREEDY), want, strict=True):
        assert_same(got, w)
    stats = spec.engine.speculation_stats()
    assert stats["num_drafts"] > 50 and stats["drafted_per_position"][2] > 0
    # Tight: 40 blocks of 4 cannot hold all five at full length, 16 tokens a step chunk prefills.
    tight = eagle(model_dir, head, num_kv_blocks=40, max_num_batched_tokens=16, spec=every_step)
    engine = tight.engine
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), p, GREEDY)
    got: dict[str, list[int]] = {str(i): [] for i in range(len(PROMPTS))}
    while engine.has_unfinished_requests():
        for d in engine.step():
            got[d.request_id].extend(d.new_token_ids)
        assert_consistent(engine)
    assert engine.scheduler.num_preemptions > 0
    assert [got[str(i)] for i in range(len(PROMPTS))] == [w.token_ids for w in want]
    assert not engine.drafter.contexts, "finished sequences' head context is released"


@pytest.mark.parametrize(("arch", "complex_rope"), [("llama", True), ("llama", False), ("deepseek_v3", True)])
def test_drafts_are_what_the_trained_head_predicts(checkpoint_factory, tmp_path, arch, complex_rope):
    """The engine's drafting (observe, then k steps on its own states; norm weights folded into
    the matmuls; the rotary as a complex multiply on CPU, or the rotary kernel as on a GPU) and
    the trainer's unrolled forward of the checkpoint are the same computation: fed the engine's
    own drafts as the tokens, the trainer's step-j prediction at the last position is the
    engine's j-th draft, for two sequences of different lengths drafted together. The target's
    aux states are transformers' too (its decoder layers' outputs, hooked)."""
    model_dir = checkpoint_factory(arch)
    head_dir = build_eagle3_head(tmp_path / "head", model_dir, draft_vocab_size=128, seed=3, random_norms=True)
    llm = eagle(model_dir, head_dir, k=4)
    engine = llm.engine
    engine.drafter.draft = DraftPass(engine.drafter.head, complex_rope=complex_rope)
    prompts = {"r": PROMPTS[0], "s": PROMPTS[2][:41]}
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    engine.step()  # prefill: the head observes both prompts, each samples its first token
    seqs = [engine.requests[rid] for rid in prompts]
    drafted = engine.drafter.propose(seqs, [4, 4])
    checkpoint = unfolded_head(head_dir, model_dir)
    features = TargetFeatures(model_dir, engine.drafter.aux_layer_ids)
    for seq, drafts in zip(seqs, drafted, strict=True):
        assert len(drafts) == 4
        ids = torch.tensor([seq.token_ids + drafts])
        with torch.no_grad():
            logits = unroll(checkpoint, features(ids, torch.ones_like(ids)), ids, 4)
        p = seq.num_tokens - 2  # the last position with a target state the head observed
        assert [int(checkpoint.to_target(step[0, p].argmax())) for step in logits] == drafts
    for rid in prompts:
        engine.abort_request(rid)


def unfolded_head(head_dir, model_dir) -> Eagle3Head:
    """The head as its checkpoint has it (norm weights in the norms), on the target's embedding."""
    from workers.engine.loader import iter_tensors

    embed = torch.nn.Embedding.from_pretrained(dict(iter_tensors(model_dir))["model.embed_tokens.weight"])
    head = Eagle3Head(read_eagle3(head_dir), rope_from(json.loads((head_dir / "config.json").read_text())), embed)
    head.load_weights(dict(iter_tensors(head_dir)))
    return head.eval()


def test_folding_the_norm_weights_keeps_the_heads_function(checkpoint_factory, tmp_path):
    """fold_norm_weights moves each norm's weight into the matmul after it: the unrolled head
    predicts the same logits, and its norms are left with weight one."""
    model_dir = checkpoint_factory("llama")
    head_dir = build_eagle3_head(tmp_path / "head", model_dir, seed=4, random_norms=True)
    head, folded = unfolded_head(head_dir, model_dir), unfolded_head(head_dir, model_dir)
    assert not torch.equal(head.norm.weight, torch.ones_like(head.norm.weight))
    with pytest.raises(ValueError, match="norm weights folded"):
        DraftPass(folded)  # drafting assumes the weights are in the matmuls
    fold_norm_weights(folded)
    for name in NORMS:
        assert torch.equal(getattr(folded, name).weight, torch.ones_like(folded.norm.weight))
    generator = torch.Generator().manual_seed(0)
    aux = torch.randn(2, 9, 3 * head.spec.target_hidden_size, generator=generator)
    ids = torch.randint(0, head.spec.vocab_size, (2, 9), generator=generator)
    with torch.no_grad():
        for want, got in zip(unroll(head, aux, ids, 3), unroll(folded, aux, ids, 3), strict=True):
            assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


def test_demo_pair_is_lossless_and_accepts_most_drafts():
    """The committed demo model and its trained head: greedy answers (tokens and logprobs) are
    the plain engine's, and the head's drafts are mostly accepted."""
    from workers.bench.spec import build_workloads

    chats, _ = build_workloads(4, seed=7)
    base = plain(DEMO_MODEL, block_size=16)
    spec = eagle(DEMO_MODEL, DEMO_DRAFT, block_size=16)
    tokenizer = base.tokenizer
    prompts = [tokenizer.apply_chat_template(m[:1], tools=t) for kind in chats.values() for m, t in kind]
    params = SamplingParams(temperature=0.0, max_tokens=64, logprobs=1)
    want = generate(base, prompts, params)
    for p, w in zip(prompts, want, strict=True):  # alone
        assert_same(generate(spec, [p], params)[0], w)
    for got, w in zip(generate(spec, prompts, params), want, strict=True):  # all eight together
        assert_same(got, w)
    stats = spec.engine.speculation_stats()
    assert stats["mean_acceptance_length"] > 2.0, stats
    # Stop strings ending inside an accepted run: a piece of the middle of each answer.
    for p, w in zip(prompts, want, strict=True):
        stop = w.text[len(w.text) // 2 : len(w.text) // 2 + 3]
        stopped = SamplingParams(temperature=0.0, max_tokens=64, logprobs=1, stop=[stop])
        assert_same(generate(spec, [p], stopped)[0], generate(base, [p], stopped)[0])


def test_a_head_that_does_not_fit_its_target_is_refused(checkpoint_factory, tmp_path):
    llama, qwen3 = checkpoint_factory("llama"), checkpoint_factory("qwen3", vocab_size=300)
    head = build_eagle3_head(tmp_path / "head", llama)
    with pytest.raises(ModelLoadError, match="does not fit the target: the draft's vocab_size is"):
        eagle(qwen3, head)
    deep = build_eagle3_head(tmp_path / "deep", llama, aux_layer_ids=[0, 1, 9])
    with pytest.raises(ModelLoadError, match=r"aux hidden state layers \[9\] are not layers of the target"):
        eagle(llama, deep)
    broken = build_eagle3_head(tmp_path / "broken", llama)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["midlayer.self_attn.k_proj.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="midlayer.self_attn.k_proj.weight is missing"):
        eagle(llama, broken)
    wild = build_eagle3_head(tmp_path / "wild", llama, draft_vocab_size=64)
    tensors = load_file(str(wild / "model.safetensors"))
    tensors["d2t"][-1] = 10**6
    save_file(tensors, str(wild / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="d2t maps draft ids outside the target vocabulary"):
        eagle(llama, wild)


def test_a_head_with_its_own_embedding_uses_it(checkpoint_factory, tmp_path):
    """Heads that ship embed_tokens (some public ones do) draft with theirs, not the target's."""
    model_dir = checkpoint_factory("llama")
    head_dir = build_eagle3_head(tmp_path / "head", model_dir, seed=5)
    config = json.loads((model_dir / "config.json").read_text())
    tensors = load_file(str(head_dir / "model.safetensors"))
    tensors["embed_tokens.weight"] = torch.randn(config["vocab_size"], config["hidden_size"]) * 3
    save_file(tensors, str(head_dir / "model.safetensors"))
    engine = eagle(model_dir, head_dir).engine
    assert torch.equal(engine.drafter.head.embed_tokens.weight, tensors["embed_tokens.weight"])
    assert engine.drafter.head.embed_tokens is not engine.model.model.embed_tokens
    want = generate(plain(model_dir), PROMPTS[:2], GREEDY)
    for got, w in zip(generate(eagle(model_dir, head_dir), PROMPTS[:2], GREEDY), want, strict=True):
        assert_same(got, w)


def test_speculation_defaults_per_method():
    """Each method stops speculating above its own measured batch size (speculative/config.py)."""
    eagle3 = SpeculativeConfig.from_dict({"method": "eagle3", "model": "/x", "num_speculative_tokens": 3})
    ngram = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3})
    assert (eagle3.disable_by_batch_size, ngram.disable_by_batch_size) == (3, 4)
    chosen = {"method": "eagle3", "model": "/x", "num_speculative_tokens": 3, "disable_by_batch_size": 6}
    assert SpeculativeConfig.from_dict(chosen).disable_by_batch_size == 6
    with pytest.raises(RequestError, match="unknown keys \\['prompt_lookup_max'\\] for method 'eagle3'"):
        SpeculativeConfig.from_dict({**chosen, "prompt_lookup_max": 3})


def test_a_head_that_missed_part_of_the_answer_does_not_draft():
    """Three requests decode together above the speculation threshold (the head is not fed);
    when two finish, the third runs alone: its head context would start inside its answer, so
    it drafts nothing, while the same request alone from the start drafts. Tokens are the plain
    engine's either way."""
    from workers.bench.spec import build_workloads

    chats, _ = build_workloads(3, seed=11)
    tokenizer = plain(DEMO_MODEL, block_size=16).tokenizer
    prompts = [tokenizer.apply_chat_template(m[:1], tools=t) for m, t in chats["tool_calls"][:3]]
    lengths = [4, 6, 40]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    want = [o.outputs[0] for o in plain(DEMO_MODEL, block_size=16).generate(prompts, params)]

    together = eagle(DEMO_MODEL, DEMO_DRAFT, block_size=16, spec={"disable_by_batch_size": 1})
    got = [o.outputs[0] for o in together.generate(prompts, params)]
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert together.engine.speculation_stats()["num_drafts"] == 0

    alone = eagle(DEMO_MODEL, DEMO_DRAFT, block_size=16, spec={"disable_by_batch_size": 1})
    got = [o.outputs[0] for o in alone.generate([prompts[2]], params[2])]
    assert got[0].token_ids == want[2].token_ids
    assert alone.engine.speculation_stats()["num_drafts"] > 0


@pytest.mark.parametrize("arch", ["llama", "deepseek_v3"])
def test_the_trainer_writes_a_head_the_engine_loads(checkpoint_factory, tmp_path, arch, capsys):
    """`python -m workers.draft_training.train_eagle3` end to end, a few steps: the target answers the
    prompts, the head trains on its aux states, and the directory it writes is a head the
    engine loads for that target and drafts with, outputs unchanged."""
    from workers.draft_training.train_eagle3 import main

    model_dir = checkpoint_factory(arch)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in PROMPTS))
    out = tmp_path / "head"
    argv = ["--target", str(model_dir), "--data", str(data), "--out", str(out), "--steps", "3", "--batch", "2"]
    assert main([*argv, "--max-new-tokens", "12", "--draft-vocab", "64"]) == 0
    assert "saved" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == 64 and config["architectures"] == ["LlamaForCausalLMEagle3"]
    spec = eagle(model_dir, out, spec={"draft_backoff": 0})
    want = generate(plain(model_dir), PROMPTS[:2], GREEDY)
    for got, w in zip(generate(spec, PROMPTS[:2], GREEDY), want, strict=True):
        assert_same(got, w)
    assert spec.engine.speculation_stats()["num_drafts"] > 0
