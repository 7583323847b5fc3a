"""DeepseekV3ForCausalLM (DeepSeek-V3, Kimi K2): MLA over a latent KV cache and MoE, against
transformers on tiny random checkpoints: with and without q_lora_rank, group-limited routing
and none (Kimi-style n_group = 1), a dense first layer, a shared expert, yarn rope."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
import transformers

from tests.engine.test_disaggregation import handoff
from tests.engine.test_parallel_parity import generate_tight
from tests.engine.test_parity import MAX_TOKENS, PROMPTS, reference
from workers.engine import LLM, RequestError, SamplingParams
from workers.engine.config import EngineConfig, ModelConfig, rope_from
from workers.engine.errors import ModelLoadError
from workers.engine.kv_layout import kv_layout_for
from workers.engine.layers.moe import route
from workers.engine.layers.rotary import cos_sin_table, inverse_frequencies, yarn_attention_factor
from workers.engine.llm_engine import LLMEngine
from workers.engine.parallel.config import ParallelConfig

FIXTURES = Path(__file__).resolve().parents[2] / "controlplane" / "planner" / "fixtures"
ARCHS = ["deepseek_v3", "deepseek_v3_no_q_lora", "kimi_k2"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=1, ignore_eos=True)


def fixture_config(name: str) -> dict:
    raw = json.loads((FIXTURES / name / "config.json").read_text())
    return raw.get("text_config", raw)


def assert_matches(completion, ref_tokens, ref_logprobs):
    assert completion.token_ids == ref_tokens
    mine = [completion.logprobs[i][t] for i, t in enumerate(completion.token_ids)]
    assert max(abs(a - b) for a, b in zip(mine, ref_logprobs, strict=True)) < 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_and_logprobs_match_transformers(checkpoint_factory, arch):
    """Prefill (expanded MLA) then decode (absorbed MLA), batched, alone, and again from the
    prefix cache (a chunk attending to cached latents)."""
    model_dir = checkpoint_factory(arch)
    refs = [reference(model_dir, p) for p in PROMPTS]
    llm = LLM(str(model_dir), device="cpu", dtype="float32", block_size=4)
    batched = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)
    cached = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)
    assert cached[2].num_cached_tokens >= 44
    for out, again, (tokens, logprobs) in zip(batched, cached, refs, strict=True):
        assert_matches(out.outputs[0], tokens, logprobs)
        assert_matches(again.outputs[0], tokens, logprobs)
    alone = LLM(str(model_dir), device="cpu", dtype="float32", block_size=4, enable_prefix_caching=False)
    for prompt, (tokens, logprobs) in zip(PROMPTS, refs, strict=True):
        assert_matches(alone.generate({"prompt_token_ids": prompt}, GREEDY)[0].outputs[0], tokens, logprobs)


def test_chunked_prefill_and_preemption_change_nothing(checkpoint_factory):
    model_dir = checkpoint_factory("deepseek_v3")
    refs = [reference(model_dir, p) for p in PROMPTS]
    # 8 tokens a step chunks every prompt; 20 blocks of 4 cannot hold all three at once.
    llm = LLM(str(model_dir), dtype="float32", block_size=4, max_num_batched_tokens=8, num_kv_blocks=20)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)
    for out, (tokens, logprobs) in zip(outs, refs, strict=True):
        assert_matches(out.outputs[0], tokens, logprobs)
    assert llm.engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("n_group,topk_group", [(4, 2), (1, 1), (8, 3)])
def test_routing_equals_the_reference_router(n_group, topk_group):
    config = transformers.DeepseekV3Config(
        hidden_size=32,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=2.827,
        norm_topk_prob=True,
    )
    torch.manual_seed(n_group)
    router = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3TopkRouter(config)
    with torch.no_grad():
        router.weight.normal_(0, 0.5)
        router.e_score_correction_bias.normal_(0, 0.3)
    x = torch.randn(64, 32)
    _, ref_weights, ref_ids = router(x)
    raw = {**config.to_dict(), "architectures": ["DeepseekV3ForCausalLM"], "intermediate_size": 64}
    moe = ModelConfig.from_dict(raw).moe
    weights, ids = route(x @ router.weight.t(), router.e_score_correction_bias, moe)
    order, ref_order = ids.argsort(-1), ref_ids.argsort(-1)
    assert torch.equal(ids.gather(1, order), ref_ids.gather(1, ref_order))
    assert torch.allclose(weights.gather(1, order), ref_weights.gather(1, ref_order), atol=1e-6)
    if n_group > 1:  # the group limit changed some choice (else this case would test nothing)
        plain = (x @ router.weight.t()).sigmoid() + router.e_score_correction_bias
        assert not torch.equal(plain.topk(4, -1)[1].sort(-1)[0], ids.sort(-1)[0])


@pytest.mark.parametrize("fixture", ["deepseek-v3", "kimi-k2.5"])
def test_yarn_rope_equals_transformers(fixture):
    raw = fixture_config(fixture)
    config = transformers.DeepseekV3Config(
        **{k: v for k, v in raw.items() if k in transformers.DeepseekV3Config.__annotations__ or k == "rope_scaling"}
    )
    rope_init = transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS["yarn"]
    ref_inv, ref_factor = rope_init(config)
    rope = rope_from(raw)
    assert rope.kind == "yarn" and rope.factor == (40 if fixture == "deepseek-v3" else 64)
    assert torch.allclose(inverse_frequencies(64, rope), ref_inv, rtol=1e-6)
    assert yarn_attention_factor(rope) == pytest.approx(ref_factor)
    table = cos_sin_table(64, 16, rope)
    freqs = torch.outer(torch.arange(16).float(), ref_inv)
    assert torch.allclose(table, torch.cat((freqs.cos(), freqs.sin()), -1) * ref_factor, atol=1e-6)
    # The softmax scale: transformers' DeepseekV3Attention.scaling for this config.
    from workers.engine.layers.rotary import yarn_softmax_scale

    ref = transformers.models.deepseek_v3.modeling_deepseek_v3.yarn_apply_mscale(config.rope_parameters, 192**-0.5)
    assert yarn_softmax_scale(rope, 192**-0.5) == pytest.approx(ref)


def test_latent_cache_bytes_per_token_equal_the_formula(checkpoint_factory):
    # DeepSeek-V3 / Kimi K2: 61 layers × (kv_lora_rank 512 + qk_rope_head_dim 64) × 2 bytes (bf16).
    for name in ("deepseek-v3", "kimi-k2.5"):
        layout = kv_layout_for(ModelConfig.from_dict(fixture_config(name)))
        assert (layout.kind, layout.parts, layout.heads, layout.width) == ("mla", 1, 1, 576)
        assert layout.bytes_per_token(torch.bfloat16) == 61 * 576 * 2 == 70272  # 68.6 KiB
    # The GQA layout of the same formula for a dense model: 2 × layers × kv_heads × head_dim.
    llama = ModelConfig.from_dict(json.loads((FIXTURES / "llama-3.1-70b" / "config.json").read_text()))
    assert kv_layout_for(llama).bytes_per_token(torch.bfloat16) == 2 * 80 * 8 * 128 * 2
    # The engine allocates exactly that: tiny config, 3 layers × (32 + 16) fp32 values per token.
    engine = LLMEngine(EngineConfig(model=str(checkpoint_factory("deepseek_v3")), dtype="float32", num_kv_blocks=10))
    kv = engine.runner.kv_cache
    assert kv.shape == (3, 1, 10, 16, 1, 48)
    assert kv.nbytes == 10 * 16 * 3 * 48 * 4
    layout = engine.kv_layout()
    assert (layout["kv_layout"], layout["kv_parts"], layout["num_kv_heads"], layout["head_dim"]) == ("mla", 1, 1, 48)


def test_disaggregated_handoff_of_latent_blocks(checkpoint_factory):
    """A decode engine given a prefill engine's latent blocks decodes exactly as colocated."""
    model_dir = checkpoint_factory("kimi_k2")
    refs = [reference(model_dir, p) for p in PROMPTS]

    def make(blocks):
        return LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", block_size=4, num_kv_blocks=blocks))

    prefill, decode = make(64), make(40)
    for i, (prompt, (tokens, logprobs)) in enumerate(zip(PROMPTS, refs, strict=True)):
        deltas, _ = handoff(prefill, decode, f"r{i}", prompt, GREEDY)
        assert [t for d in deltas for t in d.new_token_ids] == tokens
        got = [lp for d in deltas for lp in d.new_logprobs]
        assert max(abs(g[t] - r) for g, t, r in zip(got, tokens, logprobs, strict=True)) < 1e-3
    assert decode.block_manager.num_free_blocks == 40


def test_ngram_speculation_is_lossless(checkpoint_factory):
    model_dir = checkpoint_factory("deepseek_v3")
    prompts = [[5, 9, 33, 100, 7, 8, 9, 10, 11] * 3, list(range(20, 50)) * 2, [7] * 10]
    params = SamplingParams(temperature=0.0, max_tokens=24, logprobs=1, ignore_eos=True)
    base = LLM(str(model_dir), dtype="float32", block_size=4)
    spec = LLM(
        str(model_dir),
        dtype="float32",
        block_size=4,
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": 3,
            "disable_by_batch_size": 8,
            "draft_backoff": 0,  # draft at every step, rejected or not
        },
    )
    want = base.generate([{"prompt_token_ids": p} for p in prompts], params)
    got = spec.generate([{"prompt_token_ids": p} for p in prompts], params)
    for g, w in zip(got, want, strict=True):
        g, w = g.outputs[0], w.outputs[0]
        assert g.token_ids == w.token_ids
        assert max(abs(a[t] - b[t]) for a, b, t in zip(g.logprobs, w.logprobs, g.token_ids, strict=True)) < 1e-4
    stats = spec.engine.speculation_stats()
    assert 0 < stats["num_accepted_tokens"] < stats["num_draft_tokens"]


def test_what_is_not_built_is_refused_clearly(checkpoint_factory, tmp_path):
    model_dir = checkpoint_factory("deepseek_v3")
    raw = json.loads((model_dir / "config.json").read_text())
    for key, value, message in [
        ("scoring_func", "softmax", "scoring_func 'softmax' is not supported"),
        ("topk_method", "greedy", "topk_method 'greedy' is not supported"),
        ("hidden_act", "gelu", "hidden_act 'gelu' is not supported"),
        ("n_group", 3, "8 experts in 3 groups"),
    ]:
        with pytest.raises(ModelLoadError, match=message):
            ModelConfig.from_dict({**raw, key: value})


def test_the_multi_token_prediction_layer_is_skipped(checkpoint_factory, tmp_path):
    """DeepSeek-V3 checkpoints hold one layer past num_hidden_layers (MTP): it is not loaded."""
    import shutil

    from safetensors.torch import load_file, save_file

    source = checkpoint_factory("deepseek_v3")
    target = tmp_path / "with-mtp"
    shutil.copytree(source, target)
    tensors = load_file(str(target / "model.safetensors"))
    for name in [n for n in tensors if n.startswith("model.layers.2.")]:
        tensors[name.replace("model.layers.2.", "model.layers.3.")] = tensors[name].clone()
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    tokens, logprobs = reference(source, PROMPTS[0])
    out = LLM(str(target), dtype="float32").generate({"prompt_token_ids": PROMPTS[0]}, GREEDY)[0]
    assert_matches(out.outputs[0], tokens, logprobs)
    with LLM(str(target), dtype="float32", pipeline_parallel_size=2) as llm:  # the last stage skips it too
        out = llm.generate({"prompt_token_ids": PROMPTS[0]}, GREEDY)[0]
        memory = llm.engine.rank_memory()
    assert_matches(out.outputs[0], tokens, logprobs)
    assert [m["weights"] for m in memory] == expected_rank_bytes(target, 1, 2)


def test_mla_benchmark_reports_both_forms_and_agrees(capsys):
    from workers.bench.__main__ import main

    assert main(["mla", "--json", "--context", "100", "--heads", "2", "--batch", "2", "--rounds", "1"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["max_abs_diff"] < 1e-4  # the two forms compute the same attention
    assert result["absorbed_ms"] > 0 and result["expanded_ms"] > 0
    assert result["mla_kv_bytes_per_token"] == 70272 and result["mha_over_mla"] > result["gqa_over_mla"] > 1


def test_latent_blocks_come_back_from_the_dram_tier(checkpoint_factory):
    """An evicted MLA prefix served from host DRAM gives the device cache's exact answer."""
    model_dir = checkpoint_factory("deepseek_v3")
    prompt = [(7 * i + 3) % 300 + 1 for i in range(61)]
    fillers = [[(11 * i + k) % 300 + 1 for i in range(61)] for k in (1, 2)]
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=2, ignore_eos=True)
    llm = LLM(str(model_dir), dtype="float32", block_size=4, num_kv_blocks=24, kv_tiers={"dram_bytes": 4 << 20})

    def answer(p):
        out = llm.generate({"prompt_token_ids": p}, params)[0]
        return out.outputs[0].token_ids, out.outputs[0].logprobs, out.num_cached_tokens

    answer(prompt)
    device_hit = answer(prompt)
    assert device_hit[2] == 60
    for filler in fillers:
        answer(filler)
    got = answer(prompt)
    assert got[2] == 60 and llm.engine.tier_stats()["blocks_loaded"]["dram"] == 15
    assert got[:2] == device_hit[:2]


@pytest.mark.parametrize(
    ("arch", "tp", "pp"),
    [
        ("deepseek_v3", 2, 1),  # group-limited routing, q_lora_rank
        ("kimi_k2", 2, 2),  # no group limit; stage 0 holds the dense layer and a MoE layer
        ("deepseek_v3_no_q_lora", 1, 2),
    ],
)
def test_parallel_groups_match_transformers(checkpoint_factory, arch, tp, pp):
    """MLA heads and routed experts split over the tensor-parallel ranks (expert parallelism),
    layers over the stages: transformers' tokens and logprobs, with preemption and a prefix hit;
    each rank holds exactly its share of the weights (its experts, its heads)."""
    model_dir = checkpoint_factory(arch)
    refs = [reference(model_dir, p) for p in PROMPTS]
    first, again, memory, layout = generate_tight(model_dir, tp, pp, GREEDY)
    assert again.num_cached_tokens >= 40
    for out, (tokens, logprobs) in zip(first, refs, strict=True):
        assert_matches(out.outputs[0], tokens, logprobs)
    assert_matches(again.outputs[0], *refs[2])
    assert layout["kv_layout"] == "mla" and layout["tp_size"] == tp and layout["pp_size"] == pp
    expected = expected_rank_bytes(model_dir, tp, pp)
    assert [m["weights"] for m in memory] == expected, (memory, expected)


# What each rank keeps whole: norms, the low-rank MLA projections, the routers. Everything else
# (heads, experts, MLP and vocabulary rows) is split tp ways.
_REPLICATED = re.compile(r"norm\.weight$|q_a_proj|kv_a_proj_with_mqa|mlp\.gate\.")


def expected_rank_bytes(model_dir, tp: int, pp: int) -> list[int]:
    """Each rank's weight bytes in an fp32 engine, from the checkpoint: its stage's tensors, the
    replicated ones whole and the others a tp-th (so an expert held by every rank would be
    counted against). Packed int4 words are int32 and scales are kept in the engine dtype: 4
    bytes an element either way; `weight_shape` is only checked, and the MTP layer is skipped."""
    from safetensors import safe_open

    num_layers = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    bounds = ParallelConfig(tp, pp).stage_layers(num_layers)
    per_stage = [0] * pp
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118
            layer = re.match(r"model\.layers\.(\d+)\.", name)
            if name.endswith(".weight_shape") or (layer and int(layer[1]) >= num_layers):
                continue
            nbytes = 4 * math.prod(f.get_slice(name).get_shape())
            share = nbytes if _REPLICATED.search(name) else nbytes // tp
            if layer:
                stage = next(s for s, (a, b) in enumerate(bounds) if a <= int(layer[1]) < b)
            else:
                stage = 0 if "embed_tokens" in name else pp - 1
            per_stage[stage] += share
    return [per_stage[rank // tp] for rank in range(tp * pp)]


@pytest.mark.parametrize(
    ("overrides", "tp", "message"),
    [
        ({"n_routed_experts": 6, "n_group": 2, "topk_group": 1}, 4, "6 routed experts do not split over"),
        ({"moe_intermediate_size": 30}, 4, "shared-expert width 30 does not split"),
        ({"num_attention_heads": 6}, 4, "6 attention heads do not split"),
        ({"intermediate_size": 130}, 4, "intermediate size 130 does not split"),  # the dense first layer's
    ],
)
def test_parallel_deepseek_refuses_shapes_that_do_not_split(checkpoint_factory, overrides, tp, message):
    raw = json.loads((checkpoint_factory("deepseek_v3") / "config.json").read_text())
    with pytest.raises(RequestError, match=message):
        ParallelConfig(tp).validate(ModelConfig.from_dict({**raw, **overrides}), EngineConfig(model="x"))


def test_parallel_deepseek_without_dense_layers_ignores_their_width(checkpoint_factory):
    raw = json.loads((checkpoint_factory("deepseek_v3") / "config.json").read_text())
    # Every layer MoE: intermediate_size (130, not a multiple of 4) is never used.
    cfg = ModelConfig.from_dict({**raw, "first_k_dense_replace": 0, "intermediate_size": 130})
    ParallelConfig(4).validate(cfg, EngineConfig(model="x"))
    with pytest.raises(RequestError, match="intermediate size 130"):
        ParallelConfig(4).validate(ModelConfig.from_dict({**raw, "intermediate_size": 130}), EngineConfig(model="x"))


@pytest.mark.parametrize(
    "dropped",
    [
        r"model\.layers\.1\.mlp\.experts\.1\.up_proj\.weight",  # one expert of a stacked tensor
        r"model\.layers\.0\.mlp\.up_proj\.weight",  # half of the fused gate_up
        r"model\.layers\.2\.mlp\.experts\.6\..*",  # a whole expert, held by rank 1
    ],
)
def test_a_rank_refuses_a_checkpoint_missing_part_of_its_share(checkpoint_factory, tmp_path, capfd, dropped):
    """Each parameter must be written whole: a rank counts the elements it loaded."""
    import shutil

    from safetensors.torch import load_file, save_file

    target = tmp_path / "partial"
    shutil.copytree(checkpoint_factory("deepseek_v3"), target)
    tensors = load_file(str(target / "model.safetensors"))
    kept = {n: t for n, t in tensors.items() if not re.fullmatch(dropped, n)}
    assert len(kept) < len(tensors)
    save_file(kept, str(target / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(RuntimeError) as failed:
        LLM(str(target), dtype="float32", tensor_parallel_size=2)
    # Rank 0's own error is raised; rank 1's is in its log (its exit is what rank 0 sees).
    said = str(failed.value) + capfd.readouterr().err
    assert "checkpoint is missing tensors for: layers." in said, said
