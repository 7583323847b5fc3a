"""Quantized weights: int4 (compressed-tensors pack-quantized) and fp8 (DeepSeek-V3 block)
checkpoints give the same tokens and logprobs as their dequantized fp32 twins, stay compressed
in memory, and unsupported formats are refused by name."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.engine.test_deepseek_v3 import expected_rank_bytes
from workers.bench.quant_checkpoints import fp8_config, int4_config, write_quantized
from workers.engine import LLM, SamplingParams
from workers.engine.errors import ModelLoadError
from workers.engine.kernels.quant_matmul import dequantize_fp8_block, pack_int4, unpack_int4
from workers.engine.layers.linear import Linear
from workers.engine.layers.quantized import Fp8BlockLinear, Int4PackedLinear, make_linear
from workers.engine.memory import weight_bytes
from workers.protocol.quantization import UnsupportedQuantizationError, check_loadable, quantization_config

PROMPTS = [[5, 9, 33, 100, 7, 8, 9, 10, 11], [3, 4], list(range(20, 70))]
# Kimi K2 keeps attention and the head dense and quantizes the MLP experts.
KIMI_IGNORE = ("lm_head", "re:.*self_attn.*")


def test_pack_matches_a_hand_computed_word():
    # Codes are q + 8, the first value in the lowest nibble: [1,-1,0,7,-8,2,3,-3] → 9,7,8,15,0,10,11,5.
    q = torch.tensor([[1, -1, 0, 7, -8, 2, 3, -3], [0, 0, 0, 0, 0, 0, 0, 7]], dtype=torch.int8)
    packed = pack_int4(q)
    assert packed.dtype == torch.int32
    assert packed.tolist() == [[0x5BA0F879], [0xF8888888 - (1 << 32)]]  # the top nibble sets the sign bit
    assert torch.equal(unpack_int4(packed, 8), q)


def test_pack_round_trips_with_a_partial_word():
    q = torch.randint(-8, 8, (6, 37), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    packed = pack_int4(q)
    assert packed.shape == (6, 5)
    assert torch.equal(unpack_int4(packed, 37), q)
    with pytest.raises(ValueError):
        pack_int4(torch.tensor([[8]]))


def test_fp8_dequantizes_each_block_with_its_own_scale_including_partial_edges():
    w = torch.ones(5, 3, dtype=torch.float8_e4m3fn)
    scale_inv = torch.tensor([[2.0, 3.0], [5.0, 7.0]])
    assert dequantize_fp8_block(w, scale_inv, (4, 2), torch.float32).tolist() == [[2, 2, 3]] * 4 + [[5, 5, 7]]


@pytest.fixture(scope="module")
def dirs(checkpoint_factory, tmp_path_factory):
    made = {}

    def make(name, quant, arch="llama"):
        if name not in made:
            root = tmp_path_factory.mktemp(name)
            made[name] = write_quantized(checkpoint_factory(arch), root / "q", root / "twin", quant)
        return made[name]

    return make


CASES = {
    "int4_all": (int4_config(ignore=()), "llama"),
    "int4_kimi": (int4_config(ignore=KIMI_IGNORE), "llama"),
    "int4_bias_g24": (int4_config(group_size=24), "qwen2"),  # q/k/v biases; groups not dividing 64
    "fp8_128": (fp8_config((128, 128)), "llama"),  # every block partial; qkv parts off block rows
    "fp8_16": (fp8_config((16, 16)), "qwen2"),  # parts on block rows
}


def generate(model_dir):
    llm = LLM(str(model_dir), device="cpu", dtype="float32", block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=10, logprobs=1, ignore_eos=True)
    first = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    again = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)  # prefix-cache hits
    assert again[2].num_cached_tokens >= 44
    return llm, [r.outputs[0] for r in first + again]


@pytest.mark.parametrize("case", list(CASES))
def test_quantized_checkpoint_generates_what_its_dequantized_twin_does(dirs, case):
    quant, arch = CASES[case]
    qdir, twin = dirs(case, quant, arch)
    llm, got = generate(qdir)
    _, want = generate(twin)
    kinds = {type(m) for m in llm.engine.model.modules()}
    assert (Int4PackedLinear if quant["quant_method"] != "fp8" else Fp8BlockLinear) in kinds
    for a, b in zip(got, want, strict=True):
        assert a.token_ids == b.token_ids
        diffs = [abs(a.logprobs[i][t] - b.logprobs[i][t]) for i, t in enumerate(a.token_ids)]
        assert max(diffs) < 1e-4


def test_ignored_modules_stay_dense(dirs):
    qdir, _ = dirs("int4_kimi", *CASES["int4_kimi"])
    model = LLM(str(qdir), device="cpu", dtype="float32").engine.model
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, Linear) and isinstance(layer.self_attn.o_proj, Linear)
    assert isinstance(layer.mlp.gate_up_proj, Int4PackedLinear) and isinstance(layer.mlp.down_proj, Int4PackedLinear)
    assert isinstance(model.lm_head, Linear)


def _linear_shapes(model):
    return [(m.out_features, m.in_features) for m in model.modules() if isinstance(m, (Linear, Int4PackedLinear))]


def test_resident_weights_stay_compressed(dirs):
    qdir, twin = dirs("int4_all", *CASES["int4_all"])
    quantized = LLM(str(qdir), device="cpu", dtype="float32").engine.model
    dense = LLM(str(twin), device="cpu", dtype="float32").engine.model
    shapes = _linear_shapes(dense)
    assert shapes and shapes == _linear_shapes(quantized)
    dense_linear = sum(4 * o * i for o, i in shapes)
    # int32 words of 8 values, plus one fp32 (the engine dtype) scale per 32 inputs: 1/8 + 1/32 of fp32.
    packed_linear = sum(4 * o * -(-i // 8) + 4 * o * -(-i // 32) for o, i in shapes)
    assert packed_linear == dense_linear * (1 / 8 + 1 / 32)
    # What a replica reports per rank (/metrics, memory.weight_bytes) counts the packed buffers.
    assert weight_bytes(dense) - weight_bytes(quantized) == dense_linear - packed_linear
    for m in quantized.modules():
        assert not isinstance(m, Int4PackedLinear) or not hasattr(m, "weight")


def test_fp8_weights_are_one_byte_each_plus_a_scale_per_block(dirs):
    qdir, twin = dirs("fp8_16", *CASES["fp8_16"])
    quantized = LLM(str(qdir), device="cpu", dtype="float32").engine.model
    dense = LLM(str(twin), device="cpu", dtype="float32").engine.model
    layers = [m for m in quantized.modules() if isinstance(m, Fp8BlockLinear)]
    assert len(layers) == 2 * 4  # qkv, o, gate_up, down per layer; the head stays dense
    assert all(m.weight.dtype == torch.float8_e4m3fn and m.row_block == 16 for m in layers)
    saved = sum(4 * m.out_features * m.in_features - m.out_features * m.in_features for m in layers)
    scales = sum(4 * -(-m.out_features // 16) * -(-m.in_features // 16) for m in layers)
    assert weight_bytes(dense) - weight_bytes(quantized) == saved - scales


def test_make_linear_is_the_moe_hook():
    quant = quantization_config({"quantization_config": int4_config(ignore=("re:.*shared_experts.*",))})
    expert = make_linear(quant, "model.layers.3.mlp.experts.7.down_proj", 64, 32)
    assert isinstance(expert, Int4PackedLinear) and expert.checkpoint_tensors() == {
        "model.layers.3.mlp.experts.7.down_proj.weight_packed": ("weight_packed", (0, 32)),
        "model.layers.3.mlp.experts.7.down_proj.weight_scale": ("weight_scale", (0, 32)),
        "model.layers.3.mlp.experts.7.down_proj.weight_shape": ("weight_shape", (0, 32)),
    }
    assert isinstance(make_linear(quant, "model.layers.3.mlp.shared_experts.down_proj", 64, 32), Linear)
    assert isinstance(make_linear(None, "x", 64, 32), Linear)
    mixed = quantization_config({"quantization_config": int4_config(ignore=("a.k_proj",))})
    with pytest.raises(ModelLoadError, match="different formats"):
        make_linear(mixed, ["a.q_proj", "a.k_proj"], 64, (32, 32))


@pytest.mark.parametrize(
    ("quant", "message"),
    [
        ({"quant_method": "awq", "bits": 4}, "quant_method 'awq'"),
        ({**int4_config(), "format": "int-quantized"}, "format 'int-quantized'"),
        (int4_config(num_bits=8), "num_bits=8"),
        (int4_config(symmetric=False), "symmetric=False"),
        (int4_config(actorder="group"), "actorder='group'"),
        ({**fp8_config(), "weight_block_size": None}, "per-tensor fp8"),
        ({**fp8_config(), "fmt": "e5m2"}, "fmt 'e5m2'"),
    ],
)
def test_unsupported_formats_are_refused_by_name(checkpoint_factory, tmp_path, quant, message):
    with pytest.raises(UnsupportedQuantizationError, match=message):
        quantization_config({"quantization_config": quant})
    src = checkpoint_factory("llama")
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "quantization_config": quant}))
    with pytest.raises(ModelLoadError, match=message):
        LLM(str(tmp_path), device="cpu", dtype="float32")


def _tamper(qdir, tmp_path, change):
    out = tmp_path / "tampered"
    out.mkdir()
    for f in qdir.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(out / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(out / "model.safetensors"))
    return out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.pop("model.layers.1.mlp.up_proj.weight_scale"), "missing tensors: model.layers.1.mlp.up_proj"),
        (lambda t: t.__setitem__("model.layers.0.mlp.down_proj.weight_shape", torch.tensor([64, 64])), "expected"),
        (
            lambda t: t.__setitem__(
                "model.layers.0.mlp.down_proj.weight_packed", torch.zeros(64, 16, dtype=torch.int64)
            ),
            "expected torch.int32",
        ),
        (lambda t: t.__setitem__("model.layers.0.mlp.down_proj.weight", torch.zeros(64, 128)), "has no place"),
    ],
)
def test_broken_quantized_checkpoints_fail_to_load_naming_the_tensor(dirs, tmp_path, change, message):
    qdir, _ = dirs("int4_kimi", *CASES["int4_kimi"])
    with pytest.raises(ModelLoadError, match=message):
        LLM(str(_tamper(qdir, tmp_path, change)), device="cpu", dtype="float32")


def test_fp8_checkpoint_with_a_bf16_weight_where_fp8_is_expected_fails(dirs, tmp_path):
    qdir, _ = dirs("fp8_128", *CASES["fp8_128"])

    def to_float(t):
        t["model.layers.0.mlp.down_proj.weight"] = t["model.layers.0.mlp.down_proj.weight"].float()

    with pytest.raises(ModelLoadError, match="expected torch.float8_e4m3fn"):
        LLM(str(_tamper(qdir, tmp_path, to_float)), device="cpu", dtype="float32")


def test_targets_and_ignore_follow_compressed_tensors_matching():
    quant = quantization_config(
        {
            "quantization_config": int4_config(
                ignore=("lm_head", "re:.*mlp\\.(gate|up|down)_proj$"), targets=("re:.*mlp.*",)
            )
        }
    )
    assert quant.scheme_for("model.layers.1.mlp.experts.0.up_proj").group_size == 32
    assert quant.scheme_for("model.layers.0.mlp.up_proj") is None  # Kimi's dense first layer
    assert quant.scheme_for("model.layers.1.self_attn.q_proj") is None  # not a target
    assert quant.scheme_for("lm_head") is None
    fp8 = quantization_config(
        {"quantization_config": {**fp8_config(), "modules_to_not_convert": ["model.layers.0.mlp.down_proj"]}}
    )
    assert fp8.scheme_for("model.layers.0.mlp.up_proj").block == (128, 128)
    assert fp8.scheme_for("model.layers.0.mlp.down_proj") is None and fp8.scheme_for("lm_head") is None


# Kimi K2 Thinking's int4 layout on its architecture: routed experts only (attention, the shared
# experts, the dense first layer and the head stay dense); DeepSeek-V3's fp8: every linear layer.
KIMI_EXPERTS_ONLY = ("lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", r"re:model\.layers\.0\.mlp\..*")
MLA_CASES = {
    "kimi_int4_experts": (int4_config(ignore=KIMI_EXPERTS_ONLY), "kimi_k2"),
    "deepseek_fp8_128": (fp8_config((128, 128)), "deepseek_v3"),  # every block partial
    "deepseek_fp8_16": (fp8_config((16, 16)), "deepseek_v3_no_q_lora"),  # kv_a (48 rows) off block rows
}


@pytest.mark.parametrize("case", list(MLA_CASES))
def test_quantized_mla_moe_checkpoints_generate_what_their_dequantized_twins_do(dirs, case):
    """DeepSeek-V3 / Kimi K2 (MLA + MoE): quantized routed experts (a quantized layer pair per
    expert), and with fp8 the MLA projections too (the absorbed decode's W_UK and W_UV come from
    the dequantized kv_b_proj)."""
    from workers.engine.layers.moe import ExpertLinears, Experts

    quant, arch = MLA_CASES[case]
    qdir, twin = dirs(case, quant, arch)
    llm, got = generate(qdir)
    _, want = generate(twin)
    model = llm.engine.model
    kind = Int4PackedLinear if quant["quant_method"] != "fp8" else Fp8BlockLinear
    moe = model.model.layers[1].mlp
    assert isinstance(moe.experts, ExpertLinears) and isinstance(moe.experts.down[0], kind)
    assert not any(isinstance(m, Experts) for m in model.modules())
    attn = model.model.layers[1].self_attn
    assert isinstance(attn.kv_b_proj, kind if kind is Fp8BlockLinear else Linear)
    for a, b in zip(got, want, strict=True):
        assert a.token_ids == b.token_ids
        diffs = [abs(a.logprobs[i][t] - b.logprobs[i][t]) for i, t in enumerate(a.token_ids)]
        assert max(diffs) < 1e-4
    assert weight_bytes(model) < weight_bytes(LLM(str(twin), device="cpu", dtype="float32").engine.model)


def test_a_quantization_config_leaving_some_experts_dense_is_refused(checkpoint_factory, tmp_path):
    quant = int4_config(ignore=(*KIMI_EXPERTS_ONLY, r"re:.*experts\.3\..*"))
    qdir, _ = write_quantized(checkpoint_factory("kimi_k2"), tmp_path / "q", tmp_path / "twin", quant)
    with pytest.raises(ModelLoadError, match="leaves some of model.layers.1.mlp.experts's experts dense"):
        LLM(str(qdir), device="cpu", dtype="float32")


def test_loadable_formats_are_checked_at_registration(checkpoint_factory):
    fp8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    check_loadable({"architectures": ["DeepseekV3ForCausalLM"], "quantization_config": fp8})
    with pytest.raises(UnsupportedQuantizationError, match="quant_method 'awq'"):
        check_loadable({"architectures": ["DeepseekV3ForCausalLM"], "quantization_config": {"quant_method": "awq"}})


def test_int4_experts_at_tensor_parallel_generate_what_one_device_does(dirs):
    """Kimi K2's layout at tp=2: each rank loads its routed experts whole (packed int4) and its
    slice of the dense attention; the group gives one device's tokens and logprobs."""
    quant, arch = MLA_CASES["kimi_int4_experts"]
    qdir, _ = dirs("kimi_int4_experts", quant, arch)
    _, want = generate(qdir)
    params = SamplingParams(temperature=0.0, max_tokens=10, logprobs=1, ignore_eos=True)
    with LLM(str(qdir), dtype="float32", tensor_parallel_size=2) as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
        ranks = llm.engine.rank_memory()
    got = [o.outputs[0] for o in outs]
    for a, b in zip(got, want[: len(PROMPTS)], strict=True):
        assert a.token_ids == b.token_ids
        diffs = [abs(a.logprobs[i][t] - b.logprobs[i][t]) for i, t in enumerate(a.token_ids)]
        assert max(diffs) < 1e-4
    # Each rank: its experts (packed), its heads, the replicated rest, exactly.
    assert [r["weights"] for r in ranks] == expected_rank_bytes(qdir, 2, 1)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("deepseek_fp8_16", "not built yet for model.layers.0.self_attn.q_proj"),  # every linear fp8
        ("int4_kimi", "not built yet for model.layers.0.mlp.gate_proj"),  # a dense model's MLP
    ],
)
def test_quantized_layers_a_group_would_split_are_refused(dirs, case, message):
    from workers.engine import RequestError

    quant, arch = {**CASES, **MLA_CASES}[case]
    qdir, _ = dirs(case, quant, arch)
    with pytest.raises(RequestError, match=message):
        LLM(str(qdir), dtype="float32", tensor_parallel_size=2)
