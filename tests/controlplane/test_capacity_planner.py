"""The capacity planner's arithmetic against figures computed by hand, for the three shipped
configs (controlplane/planner/fixtures). Each expected figure is written out below from the
model's published shapes, not through the planner's parts; where a public figure exists (the
checkpoint's size, the vendor's parameter count) the test compares with it too."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.planner import capacity
from controlplane.planner.capacity import Layout, PlanError, plan

FIXTURES = Path(__file__).resolve().parents[2] / "controlplane" / "planner" / "fixtures"
GB = 10**9


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name / "config.json").read_text())


def fp8(rows: int, cols: int) -> int:
    """An fp8 e4m3 weight with an fp32 scale per 128x128 block (DeepSeek-V3's weight_scale_inv)."""
    return rows * cols + math.ceil(rows / 128) * math.ceil(cols / 128) * 4


# -- Kimi K2.5 ------------------------------------------------------------------------------------
# Shapes of the published checkpoint's tensors (language_model.*, vision_tower.*, mm_projector.*).
H, KIMI_VOCAB = 7168, 163840
KIMI_ATTENTION = (
    H * 1536  # q_a_proj [1536, 7168]
    + 1536  # q_a_layernorm
    + 12288 * 1536  # q_b_proj [64 heads x (128 + 64), 1536]
    + 576 * H  # kv_a_proj_with_mqa [512 + 64, 7168]
    + 512  # kv_a_layernorm
    + 16384 * 512  # kv_b_proj [64 heads x (128 + 128), 512]
    + H * 8192  # o_proj [7168, 64 x 128]
)
KIMI_LAYER_NORMS = 2 * H
KIMI_EXPERT = 3 * 2048 * H  # gate_proj, up_proj [2048, 7168]; down_proj [7168, 2048]
KIMI_ROUTER = 384 * H + 384  # gate.weight [384, 7168] (bf16), e_score_correction_bias [384] (fp32)
KIMI_DENSE_MLP = 3 * 18432 * H  # layer 0
KIMI_TEXT = (
    2 * KIMI_VOCAB * H  # embed_tokens, lm_head (untied)
    + H  # final norm
    + (KIMI_ATTENTION + KIMI_LAYER_NORMS + KIMI_DENSE_MLP)  # 1 dense layer
    + 60 * (KIMI_ATTENTION + KIMI_LAYER_NORMS + 384 * KIMI_EXPERT + KIMI_EXPERT + KIMI_ROUTER)  # 60 MoE layers
)
MOONVIT_BLOCK = (3456 * 1152 + 3456) + (1152 * 1152 + 1152) + (4304 * 1152 + 4304) + (1152 * 4304 + 1152) + 4 * 1152
KIMI_VISION = (
    1152 * 3 * 14 * 14
    + 1152  # patch_embed.proj (+ bias)
    + 64 * 64 * 1152  # patch_embed.pos_emb
    + 27 * MOONVIT_BLOCK  # wqkv, wo, fc0, fc1 (+ biases), norm0, norm1
    + 2 * 1152  # final_layernorm
    + 2 * 1152
    + (4608 * 4608 + 4608)
    + (7168 * 4608 + 7168)  # mm_projector: pre_norm, proj.0, proj.2
)
# INT4 experts as shipped: weight_packed int32 [rows, cols / 8] and a bf16 weight_scale [rows, cols / 32].
KIMI_EXPERT_INT4 = 2 * (2048 * 896 * 4 + 2048 * 224 * 2) + (7168 * 256 * 4 + 7168 * 64 * 2)
KIMI_ROUTED = 60 * 384 * KIMI_EXPERT
KIMI_INT4_BYTES = (
    60 * 384 * KIMI_EXPERT_INT4
    + (KIMI_TEXT - KIMI_ROUTED - 60 * 384) * 2  # everything else in bf16 ...
    + 60 * 384 * 4  # ... but the correction biases, fp32
    + KIMI_VISION * 2
)
KIMI_KV = 61 * (512 + 64) * 2  # bf16 latent + rope key, per token, all layers


def test_kimi_k25_parameters_and_int4_weights():
    p = plan(fixture("kimi-k2.5"), Layout())
    assert (p["architecture"], p["text_architecture"], p["attention"]) == (
        "KimiK25ForConditionalGeneration",
        "DeepseekV3ForCausalLM",
        "mla",
    )
    assert (p["quantization"], p["quantization_source"], p["dtype"]) == ("int4-experts", "config", "bfloat16")
    assert p["params_total"] == KIMI_TEXT + KIMI_VISION == 1_026_879_376_368
    assert p["params"]["vision"] == KIMI_VISION == 471_143_920
    # Active: all but the 376 of 384 routed experts a token does not use, and not the vision tower.
    assert p["params_active"] == KIMI_TEXT - 60 * 376 * KIMI_EXPERT == 32_861_500_928  # "32B activated"
    assert p["weight_bytes_total"] == KIMI_INT4_BYTES
    # The published checkpoint's tensors add up to 554.27 GiB; the arithmetic says ~594 GB.
    assert abs(p["weight_bytes_total"] / 2**30 - 554.27) < 0.01
    assert abs(p["weight_bytes_total"] - 594 * GB) / (594 * GB) < 0.02
    assert p["weight_bytes"]["routed_experts"] == 60 * 384 * KIMI_EXPERT_INT4  # ~571 GB
    assert p["kv_bytes_per_token"] == KIMI_KV == 70_272  # 68.6 KiB
    assert p["context_tokens"] == 262144


def kimi_per_device_tp8() -> int:
    """One of 8 tensor-parallel ranks: the latent projections, norms, routers and the vision tower
    whole; the rest split eight ways (embedding and LM head by vocabulary rows)."""
    whole = (H * 1536 + 1536 + 576 * H + 512 + 2 * H) * 2  # q_a_proj, kv_a_proj_with_mqa, their norms, layer norms
    split = (12288 * 1536 + 16384 * 512 + H * 8192) * 2  # q_b_proj, kv_b_proj, o_proj
    return (
        2 * (KIMI_VOCAB // 8) * H * 2  # embed_tokens, lm_head
        + H * 2  # final norm
        + KIMI_VISION * 2
        + 61 * (whole + split // 8)
        + KIMI_DENSE_MLP * 2 // 8
        + 60 * ((384 * H * 2 + 384 * 4) + (384 * KIMI_EXPERT_INT4 + KIMI_EXPERT * 2) // 8)  # router; experts, shared
    )


def test_kimi_k25_on_8x80gb_tp8_versus_attention_data_parallel():
    p = plan(fixture("kimi-k2.5"), Layout(tensor_parallel=8, device_memory_bytes=80 * GB, memory_fraction=1.0))
    per_device = kimi_per_device_tp8()
    assert p["weight_bytes_per_device"] == per_device
    # TP replicates MLA's latent cache on every rank: each device holds all 61 layers' latent per token.
    assert p["kv_bytes_per_token_per_device"] == KIMI_KV
    assert p["free_bytes_per_device"] == 80 * GB - per_device
    assert p["max_kv_tokens"] == (80 * GB - per_device) // KIMI_KV == 40_914
    assert p["max_batch_at_context"] == 0  # not one 256K-token sequence
    # Attention data-parallel: each rank caches its own sequences, 8x the tokens in the same memory ...
    dp = p["attention_data_parallel"]
    assert dp["max_kv_tokens"] == 8 * 40_914
    # ... but each rank then holds all the attention weights too (q_b, kv_b, o no longer split),
    # which 80 GB devices cannot.
    split = (12288 * 1536 + 16384 * 512 + H * 8192) * 2
    assert dp["weight_bytes_per_device_replicated_attention"] == per_device + 61 * (split - split // 8)
    assert dp["max_kv_tokens_replicated_attention"] == 0

    # The round arithmetic: 8 x 80 GB - 594 GB leaves ~46 GB, 5.75 GB a rank if the weights
    # split evenly: ~81.8K tokens replicated by TP, ~654K with attention data-parallel. The planner's
    # is lower because some weights are whole on every rank (see kimi_per_device_tp8).
    ideal_free = (8 * 80 * GB - 594 * GB) // 8
    assert ideal_free // KIMI_KV == 81_824 and 8 * (ideal_free // KIMI_KV) == 654_592


def test_kimi_k25_fits_8x141gib_at_the_engine_memory_fraction():
    p = plan(fixture("kimi-k2.5"), Layout(tensor_parallel=8, device_memory_bytes=141 * 2**30))
    assert p["memory_fraction"] == 0.85 and p["fits"]
    free = int(141 * 2**30 * 0.85) - kimi_per_device_tp8()
    assert p["max_kv_tokens"] == free // KIMI_KV


def test_kimi_k25_with_fp8_everywhere_would_need_a_terabyte():
    p = plan(fixture("kimi-k2.5"), Layout(quantization="fp8"))
    assert p["quantization_source"] == "request"
    assert 1.03e12 < p["weight_bytes_total"] < 1.05e12  # the notes' "FP8 experts would need 1.04 TB"


# -- DeepSeek-V3 ------------------------------------------------------------------------------------
DS_VOCAB = 129280
# q_a_proj [1536, 7168], q_b_proj [128 heads x (128 + 64), 1536], kv_a_proj_with_mqa [512 + 64, 7168],
# kv_b_proj [128 heads x (128 + 128), 512], o_proj [7168, 128 heads x 128]; the two latent norms.
DS_ATTENTION_PARAMS = H * 1536 + 24576 * 1536 + 576 * H + 32768 * 512 + H * 16384 + 1536 + 512
DS_EXPERT = 3 * 2048 * H
DS_DENSE_MLP = 3 * 18432 * H
DS_TOTAL = (
    2 * DS_VOCAB * H
    + H
    + 3 * (DS_ATTENTION_PARAMS + 2 * H + DS_DENSE_MLP)  # first_k_dense_replace 3
    + 58 * (DS_ATTENTION_PARAMS + 2 * H + 256 * DS_EXPERT + DS_EXPERT + 256 * H + 256)
)
DS_FP8_ATTENTION = fp8(1536, H) + fp8(24576, 1536) + fp8(576, H) + fp8(32768, 512) + fp8(H, 16384)
DS_FP8_EXPERT = 2 * fp8(2048, H) + fp8(H, 2048)
DS_FP8_BYTES = (
    2 * DS_VOCAB * H * 2  # embeddings, LM head in bf16
    + H * 2
    + 61 * (DS_FP8_ATTENTION + (1536 + 512 + 2 * H) * 2)  # norms in bf16
    + 3 * (2 * fp8(18432, H) + fp8(H, 18432))
    + 58 * (257 * DS_FP8_EXPERT + 256 * H * 2 + 256 * 4)  # 256 routed + 1 shared; bf16 gate, fp32 bias
)


def test_deepseek_v3_parameters_fp8_weights_and_latent_cache():
    p = plan(fixture("deepseek-v3"), Layout())
    assert (p["attention"], p["quantization"], p["quantization_source"]) == ("mla", "fp8", "config")
    assert p["params_total"] == DS_TOTAL == 671_026_419_200  # DeepSeek: 671B without the MTP module
    active = DS_TOTAL - 58 * 248 * DS_EXPERT
    assert p["params_active"] == active == 37_552_297_472
    # DeepSeek reports 36.6B activated, not counting the input embedding (a lookup: 0.93B).
    assert abs(active - DS_VOCAB * H - 36.6e9) < 0.05e9
    assert p["weight_bytes_total"] == DS_FP8_BYTES
    assert p["kv_bytes_per_token"] == 61 * 576 * 2  # the same latent as Kimi K2.5: 70,272 bytes
    assert any("multi-token-prediction" in note for note in p["notes"])


def test_deepseek_v3_pipeline_stages_split_layers_as_vllm():
    p = plan(fixture("deepseek-v3"), Layout(tensor_parallel=8, pipeline_parallel=2, device_memory_bytes=80 * GB))
    # 61 layers over 2 stages: 31 on the first (with the embeddings), 30 on the last (with the LM head).
    assert [(s["first_layer"], s["last_layer"]) for s in p["stages"]] == [(0, 30), (31, 60)]
    assert [s["kv_bytes_per_token_per_device"] for s in p["stages"]] == [31 * 576 * 2, 30 * 576 * 2]
    assert p["weight_bytes_per_device"] == max(s["weight_bytes_per_device"] for s in p["stages"])
    assert p["max_kv_tokens"] == min(s["max_kv_tokens"] for s in p["stages"])


# -- Llama-3.1-70B ----------------------------------------------------------------------------------
L_H, L_VOCAB, L_INTER = 8192, 128256, 28672
L_LAYER = (
    L_H * 8192 + 2 * L_H * 1024 + 8192 * L_H + 3 * L_H * L_INTER + 2 * L_H
)  # q, k+v (8 heads x 128), o, MLP, norms
L_TOTAL = 2 * L_VOCAB * L_H + L_H + 80 * L_LAYER


def test_llama_31_70b_parameters_gqa_cache_and_tp8():
    p = plan(fixture("llama-3.1-70b"), Layout(tensor_parallel=8, device_memory_bytes=80 * GB, memory_fraction=0.9))
    assert (p["attention"], p["quantization"], p["dtype"]) == ("gqa", "none", "bfloat16")
    assert p["params_total"] == p["params_active"] == L_TOTAL == 70_553_706_496
    assert p["weight_bytes_total"] == 2 * L_TOTAL
    assert p["kv_bytes_per_token"] == 2 * 80 * 8 * 128 * 2 == 327_680
    # 8 KV heads over 8 ranks: one head each.
    assert p["kv_bytes_per_token_per_device"] == 2 * 80 * 1 * 128 * 2
    per_device = (2 * (L_VOCAB // 8) * L_H + L_H + 80 * ((L_LAYER - 2 * L_H) // 8 + 2 * L_H)) * 2
    assert p["weight_bytes_per_device"] == per_device
    assert p["max_kv_tokens"] == (72 * GB - per_device) // 40_960
    assert p["max_batch_at_context"] == p["max_kv_tokens"] // 131072
    assert p["attention_data_parallel"] is None


def test_llama_kv_heads_are_replicated_when_fewer_than_ranks():
    p = plan(fixture("llama-3.1-70b"), Layout(tensor_parallel=16))
    assert p["kv_bytes_per_token_per_device"] == 2 * 80 * 1 * 128 * 2  # one of the 8 heads on each of 16 ranks
    assert any("replica of one" in note for note in p["notes"])


def test_llama_does_not_fit_one_80gb_device_and_says_so():
    p = plan(fixture("llama-3.1-70b"), Layout(device_memory_bytes=80 * GB))
    assert p["fits"] is False and p["max_kv_tokens"] == 0 and p["max_batch_at_context"] == 0
    assert p["free_bytes_per_device"] == 68 * GB - 2 * L_TOTAL
    assert any(note.startswith(f"does not fit: {2 * L_TOTAL:,} bytes") for note in p["notes"])


def test_without_device_memory_the_device_figures_are_null():
    p = plan(fixture("llama-3.1-70b"), Layout())
    assert p["device_memory_bytes"] is None and p["fits"] is None and p["max_kv_tokens"] is None
    assert p["weight_bytes_per_device"] == 2 * L_TOTAL


def test_dense_fp8_and_mha_and_tied_embeddings():
    config = {**fixture("llama-3.1-70b"), "num_key_value_heads": 64, "tie_word_embeddings": True}
    p = plan(config, Layout(quantization="fp8"))
    assert p["attention"] == "mha" and p["params"]["lm_head"] == 0
    assert p["kv_bytes_per_token"] == 2 * 80 * 64 * 128 * 2
    linear = 2 * fp8(8192, L_H) + 2 * fp8(8192, L_H) + 2 * fp8(L_INTER, L_H) + fp8(L_H, L_INTER)
    assert p["weight_bytes_total"] == L_VOCAB * L_H * 2 + L_H * 2 + 80 * (linear + 2 * L_H * 2)


# -- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("config", "layout", "field", "says"),
    [
        ("llama-3.1-70b", Layout(tensor_parallel=3), "tensor_parallel", "tensor_parallel 3 does not divide the 64"),
        (
            {**fixture("llama-3.1-70b"), "intermediate_size": 28000},
            Layout(tensor_parallel=64),
            "tensor_parallel",
            "tensor_parallel 64 does not divide the 28000 MLP intermediate size",
        ),
        ("deepseek-v3", Layout(tensor_parallel=6), "tensor_parallel", "does not divide the 128 attention heads"),
        (
            "deepseek-v3",
            Layout(tensor_parallel=32),
            "tensor_parallel",
            "with fp8 128x128 blocks, tensor_parallel 32 leaves 64 of the 2048 expert intermediate size per rank",
        ),
        ("llama-3.1-70b", Layout(pipeline_parallel=81), "pipeline_parallel", "the model's 80 layers"),
        ("llama-3.1-70b", Layout(quantization="int4-experts"), "quantization", "has none (a dense model)"),
        ("llama-3.1-70b", Layout(quantization="int8"), "quantization", "got 'int8'"),
        ("llama-3.1-70b", Layout(dtype="int8"), "dtype", "got 'int8'"),
    ],
)
def test_layouts_that_cannot_be_planned_are_refused_naming_the_field(config, layout, field, says):
    with pytest.raises(PlanError) as caught:
        plan(fixture(config) if isinstance(config, str) else config, layout)
    assert caught.value.field == field and says in caught.value.message


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ([1, 2], "config must be a config.json object"),
        ({"architectures": ["GPT2LMHeadModel"]}, "'GPT2LMHeadModel' is not one the planner sizes"),
        ({}, "(none: config.architectures is missing)"),
        ({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}, "config has no 'num_hidden_layers'"),
        ({**fixture("llama-3.1-70b"), "hidden_size": "8192"}, "config.hidden_size must be an integer, got '8192'"),
        ({**fixture("llama-3.1-70b"), "num_hidden_layers": 10**9}, "between 1 and 4096, got 1000000000"),
        ({**fixture("llama-3.1-70b"), "num_key_value_heads": 7}, "not a multiple of num_key_value_heads (7)"),
        (
            {**fixture("kimi-k2.5"), "text_config": {**fixture("kimi-k2.5")["text_config"], "kv_lora_rank": None}},
            "config.text_config has no 'kv_lora_rank'",
        ),
    ],
)
def test_bad_configs_are_refused_saying_what_is_wrong(config, says):
    with pytest.raises(PlanError) as caught:
        plan(config, Layout())
    assert caught.value.field == "config" and says in caught.value.message


# -- the rest -------------------------------------------------------------------------------------
def test_deepseek_without_q_lora_and_routing_every_layer():
    text = {
        **fixture("deepseek-v3"),
        "q_lora_rank": None,
        "first_k_dense_replace": 0,
        "num_hidden_layers": 2,
        "quantization_config": None,
    }
    p = plan(text, Layout())
    attention = H * 24576 + 576 * H + 512 + 32768 * 512 + H * 16384  # q_proj, kv_a, its norm, kv_b, o
    assert p["params"]["attention"] == 2 * (attention - 512)
    assert p["params"]["dense_mlp"] == 0 and p["quantization"] == "none"


def test_the_planner_uses_the_engines_memory_fraction():
    from workers.engine.config import EngineConfig

    assert EngineConfig(model="any").gpu_memory_utilization == capacity.ENGINE_MEMORY_FRACTION


def test_planning_imports_neither_torch_nor_the_engine():
    code = (
        "import json, sys; from controlplane.planner import capacity;"
        f"p = capacity.plan(json.load(open({str(FIXTURES / 'kimi-k2.5' / 'config.json')!r})), capacity.Layout());"
        "assert p['kv_bytes_per_token'] == 70272;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m.startswith('workers.engine')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
