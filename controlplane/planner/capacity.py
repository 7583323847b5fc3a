"""Capacity arithmetic from a model's config.json alone: parameters, weight bytes, KV-cache bytes
per token, and what a device layout leaves for the KV cache.

Pure Python, no Django and no torch: the web process plans without loading anything. The model
is described as a list of weight *parts* (a matrix or vector, how many copies, how tensor
parallelism splits it, whether a quantization scheme applies to it); every figure is a sum over
parts, so what was counted is visible in `params` / `weight_bytes` and said in `notes`.

Architectures: the dense Llama family (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM: GQA or MHA) and DeepseekV3ForCausalLM (MLA + MoE; what Kimi K2 and K2.5
declare, K2.5 nesting it under `text_config` beside a MoonViT vision tower).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from workers.protocol.architectures import MLA_ARCHITECTURES, SUPPORTED_ARCHITECTURES, TEXT_MODEL_TYPES

# The engine's KV budget on CUDA is this fraction of device memory (workers/engine/config.py,
# EngineConfig.gpu_memory_utilization; a test keeps the two equal).
ENGINE_MEMORY_FRACTION = 0.85

QUANTIZATIONS = ("none", "fp8", "int4-experts")
DTYPE_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2}
CANONICAL_DTYPE = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
KV_CACHE_DTYPES = ("auto", "fp8")
ARCHITECTURES = SUPPORTED_ARCHITECTURES
FP8_BLOCK = (128, 128)  # DeepSeek-V3's weight_block_size
INT4_GROUP = 32  # Kimi K2 Thinking / K2.5's compressed-tensors group_size
MAX_DIMENSION = 1 << 24  # hidden sizes, heads, experts: far above any real model, keeps answers sane
MAX_VOCAB = 1 << 28
MAX_LAYERS = 4096

# params / weight_bytes keys, in the order they are reported.
GROUPS = (
    "embeddings",
    "attention",
    "dense_mlp",
    "shared_experts",
    "routed_experts",
    "router",
    "norms",
    "lm_head",
    "vision",
)


class PlanError(ValueError):
    """A config or layout the planner cannot compute; `field` names the request field at fault."""

    def __init__(self, message: str, field: str = "config"):
        super().__init__(message)
        self.message = message
        self.field = field


@dataclass(frozen=True)
class Part:
    """`count` identical weights of `rows` x `cols` (a vector has cols 1)."""

    group: str
    rows: int
    cols: int = 1
    count: int = 1
    # How tensor parallelism places it: "tp" split across the ranks, "replicated" whole on each,
    # "vocab" split by vocabulary rows (ceil(vocab / tp) rows each), "kv" split by KV heads
    # (one head's worth per rank when there are fewer KV heads than ranks).
    shard: str = "tp"
    linear: bool = True  # a linear layer's weight matrix: what fp8 and int4 quantize
    element_bytes: int | None = None  # stored at this size whatever the dtype (fp32 router bias)
    tied: bool = False  # the same tensor as another part (tied lm_head): counted once

    @property
    def params(self) -> int:
        return self.rows * self.cols * self.count


@dataclass(frozen=True)
class Quantization:
    name: str  # one of QUANTIZATIONS
    source: str  # "config", "request" or "default"
    block: tuple[int, int] = FP8_BLOCK
    group_size: int = INT4_GROUP
    description: str = ""


@dataclass
class Shape:
    """A model as parts, ready to be priced and placed."""

    architecture: str  # the config's (e.g. KimiK25ForConditionalGeneration)
    text_architecture: str  # the decoder's (DeepseekV3ForCausalLM)
    attention: str  # "mla", "gqa" or "mha"
    head_parts: list[Part]  # stage 0: embeddings and a vision tower
    layers: list[list[Part]]
    tail_parts: list[Part]  # last stage: final norm, lm_head
    kv_elements_per_layer: int  # per token, whole model (all heads)
    num_heads: int
    num_kv_heads: int  # GQA/MHA; MLA: the latent is one shared "head"
    head_dim: int
    config_dtype: str
    context: int
    routed_expert_params: int  # of one expert (gate + up + down)
    routed_experts_idle_per_token: int  # summed over MoE layers: experts not selected
    tp_checks: list[tuple[int, str]]  # (size that TP must divide, what it is)
    quantization: Quantization
    has_routed_experts: bool
    notes: list[str] = field(default_factory=list)


# -- reading a config ---------------------------------------------------------------------------
def _int(
    cfg: dict, key: str, default: int | None = None, *, where: str = "config", low: int = 1, high: int = MAX_DIMENSION
) -> int:
    value = cfg.get(key)
    if value is None:
        value = default
    if value is None:
        raise PlanError(f"{where} has no {key!r}: it is needed to size the model")
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanError(f"{where}.{key} must be an integer, got {value!r}"[:300])
    if not low <= value <= high:
        raise PlanError(f"{where}.{key} must be between {low} and {high}, got {value}")
    return value


def _text_config(config: dict) -> tuple[str, dict, str, str]:
    """(the config's architecture, the decoder's config, the decoder's architecture, where)."""
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""
    text = config.get("text_config")
    if isinstance(text, dict):
        inner = text.get("architectures")
        text_arch = inner[0] if isinstance(inner, list) and inner and isinstance(inner[0], str) else ""
        text_arch = text_arch or TEXT_MODEL_TYPES.get(str(text.get("model_type")), "")
        if text_arch in ARCHITECTURES:
            return arch or text_arch, text, text_arch, "config.text_config"
    if arch in ARCHITECTURES:
        return arch, config, arch, "config"
    found = arch or "(none: config.architectures is missing)"
    raise PlanError(
        f"architecture {found!r} is not one the planner sizes; it sizes {', '.join(ARCHITECTURES)} "
        "(and wrappers that nest one under text_config, as Kimi K2.5 does)"[:400]
    )


def _config_dtype(config: dict, text: dict) -> str:
    """The checkpoint's dtype as the engine reads it ("auto"): torch_dtype or dtype; float32 when
    neither is given, as the engine does."""
    for source in (text, config):
        for key in ("torch_dtype", "dtype"):
            value = source.get(key)
            if isinstance(value, str) and value.lower() in DTYPE_BYTES:
                return CANONICAL_DTYPE.get(value.lower(), value.lower())
    return "float32"


def _quantization_from_config(config: dict, text: dict) -> Quantization:
    qc = config.get("quantization_config") or text.get("quantization_config")
    if not isinstance(qc, dict):
        return Quantization("none", "default", description="no quantization_config: unquantized weights")
    method = qc.get("quant_method")
    if method == "fp8":
        block = qc.get("weight_block_size") or list(FP8_BLOCK)
        if not (isinstance(block, list) and len(block) == 2 and all(type(b) is int and b > 0 for b in block)):
            raise PlanError(
                f"config quantization_config.weight_block_size must be two positive integers, got {block!r}"[:300]
            )
        return Quantization(
            "fp8",
            "config",
            block=(block[0], block[1]),
            description=f"quantization_config: fp8 ({qc.get('fmt', 'e4m3')}) with {block[0]}x{block[1]} block scales",
        )
    if method == "compressed-tensors" and qc.get("format") == "pack-quantized":
        groups = qc.get("config_groups") if isinstance(qc.get("config_groups"), dict) else {}
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, dict) else None
            if isinstance(weights, dict) and weights.get("num_bits") == 4 and weights.get("type") == "int":
                size = weights.get("group_size") or INT4_GROUP
                if type(size) is not int or size <= 0:
                    raise PlanError(
                        f"config quantization_config group_size must be a positive integer, got {size!r}"[:300]
                    )
                ignore = qc.get("ignore") if isinstance(qc.get("ignore"), list) else []
                ignored = (", ".join(str(i) for i in ignore) or "nothing")[:300]
                return Quantization(
                    "int4-experts",
                    "config",
                    group_size=size,
                    description=f"quantization_config: compressed-tensors pack-quantized int4, group "
                    f"size {size}, on the routed experts (ignored: {ignored})",
                )
    return Quantization(
        "none",
        "default",
        description=f"quantization_config quant_method {method!r} is not one the "
        "planner models: computed unquantized (pass quantization to choose)",
    )


def _max_context(text: dict, where: str) -> int:
    positions = _int(text, "max_position_embeddings", 2048, where=where, high=1 << 31)
    # Mistral (and Qwen2 with use_sliding_window) attend within a window: the engine serves that
    # much context exactly (workers/protocol/model_files.max_context).
    if text.get("use_sliding_window", text.get("model_type", "") == "mistral"):
        window = text.get("sliding_window")
        if isinstance(window, int) and not isinstance(window, bool) and window > 0:
            return min(positions, window)
    return positions


def _dense_shape(config: dict, text: dict, arch: str, text_arch: str, where: str) -> Shape:
    H = _int(text, "hidden_size", where=where)
    L = _int(text, "num_hidden_layers", where=where, high=MAX_LAYERS)
    heads = _int(text, "num_attention_heads", where=where)
    kv = _int(text, "num_key_value_heads", heads, where=where)
    if heads % kv:
        raise PlanError(f"{where}.num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv})")
    hd = text.get("head_dim") or (H // heads if H % heads == 0 else None)
    if hd is None:
        raise PlanError(f"{where} has no head_dim and hidden_size {H} is not a multiple of {heads} heads")
    hd = _int({"head_dim": hd}, "head_dim", where=where)
    inter = _int(text, "intermediate_size", where=where)
    vocab = _int(text, "vocab_size", where=where, high=MAX_VOCAB)
    tied = bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    qkv_bias = bool(text.get("attention_bias", text_arch == "Qwen2ForCausalLM"))
    o_bias = bool(text.get("attention_bias", False)) and text_arch != "Qwen2ForCausalLM"
    mlp_bias = bool(text.get("mlp_bias", False))
    layer = [
        Part("attention", heads * hd, H),  # q_proj
        Part("attention", kv * hd, H, 2, shard="kv"),  # k_proj, v_proj
        Part("attention", H, heads * hd),  # o_proj
        Part("norms", H, count=2, shard="replicated", linear=False),  # input / post-attention norms
        Part("dense_mlp", inter, H, 2),  # gate_proj, up_proj
        Part("dense_mlp", H, inter),  # down_proj
    ]
    if qkv_bias:
        layer += [
            Part("attention", heads * hd, linear=False),
            Part("attention", kv * hd, count=2, shard="kv", linear=False),
        ]
    if o_bias:
        layer.append(Part("attention", H, shard="replicated", linear=False))
    if text_arch == "Qwen3ForCausalLM":
        layer.append(Part("norms", hd, count=2, shard="replicated", linear=False))  # q_norm, k_norm
    if mlp_bias:
        layer += [
            Part("dense_mlp", inter, count=2, linear=False),
            Part("dense_mlp", H, shard="replicated", linear=False),
        ]
    attention = "mha" if kv == heads else "gqa"
    notes = [
        f"{text_arch}: {L} layers, hidden {H}, {heads} query heads of {hd}, {kv} KV head{'s' * (kv > 1)} "
        f"({'MHA' if kv == heads else 'MQA' if kv == 1 else f'GQA, {heads // kv} query heads per KV head'}), "
        f"MLP {inter}, vocabulary {vocab}" + (", embeddings tied to the LM head" if tied else ""),
        f"KV cache per token = 2 (K and V) x {L} layers x {kv} KV heads x {hd} head_dim x dtype bytes",
    ]
    return Shape(
        architecture=arch,
        text_architecture=text_arch,
        attention=attention,
        head_parts=[Part("embeddings", vocab, H, shard="vocab", linear=False)],
        layers=[list(layer) for _ in range(L)],
        tail_parts=[
            Part("norms", H, shard="replicated", linear=False),
            Part("lm_head", vocab, H, shard="vocab", linear=False, tied=tied),
        ],
        kv_elements_per_layer=2 * kv * hd,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=hd,
        config_dtype=_config_dtype(config, text),
        context=_max_context(text, where),
        routed_expert_params=0,
        routed_experts_idle_per_token=0,
        tp_checks=[(heads, "attention heads"), (inter, "MLP intermediate size")],
        quantization=_quantization_from_config(config, text),
        has_routed_experts=False,
        notes=notes,
    )


def _mla_shape(config: dict, text: dict, arch: str, text_arch: str, where: str) -> Shape:
    H = _int(text, "hidden_size", where=where)
    L = _int(text, "num_hidden_layers", where=where, high=MAX_LAYERS)
    heads = _int(text, "num_attention_heads", where=where)
    q_lora = text.get("q_lora_rank")
    q_lora = None if q_lora is None else _int(text, "q_lora_rank", where=where)
    kv_lora = _int(text, "kv_lora_rank", where=where)
    nope = _int(text, "qk_nope_head_dim", where=where)
    rope = _int(text, "qk_rope_head_dim", where=where)
    v_dim = _int(text, "v_head_dim", where=where)
    inter = _int(text, "intermediate_size", where=where)
    vocab = _int(text, "vocab_size", where=where, high=MAX_VOCAB)
    experts = text.get("n_routed_experts")
    experts = None if experts is None else _int(text, "n_routed_experts", where=where)
    tied = bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    bias = bool(text.get("attention_bias", False))
    qk_dim = nope + rope

    attention = []
    if q_lora is None:
        attention.append(Part("attention", heads * qk_dim, H))  # q_proj
    else:
        attention += [
            Part("attention", q_lora, H, shard="replicated"),  # q_a_proj: to the query latent
            Part("norms", q_lora, shard="replicated", linear=False),  # q_a_layernorm
            Part("attention", heads * qk_dim, q_lora),  # q_b_proj
        ]
    attention += [
        Part("attention", kv_lora + rope, H, shard="replicated"),  # kv_a_proj_with_mqa: latent + rope key
        Part("norms", kv_lora, shard="replicated", linear=False),  # kv_a_layernorm
        Part("attention", heads * (nope + v_dim), kv_lora),  # kv_b_proj: latent to per-head K (nope) and V
        Part("attention", H, heads * v_dim),  # o_proj
        Part("norms", H, count=2, shard="replicated", linear=False),  # input / post-attention norms
    ]
    if bias:
        attention += [
            Part("attention", kv_lora + rope, shard="replicated", linear=False),
            Part("attention", H, shard="replicated", linear=False),
        ]
        if q_lora is not None:
            attention.append(Part("attention", q_lora, shard="replicated", linear=False))
    dense_mlp = [Part("dense_mlp", inter, H, 2), Part("dense_mlp", H, inter)]

    tp_checks = [(heads, "attention heads")]
    layers, moe_layers, idle, expert_params = [], 0, 0, 0
    first_dense = _int(text, "first_k_dense_replace", 0, where=where, low=0) if experts else L
    if experts:
        topk = _int(text, "num_experts_per_tok", where=where, high=experts)
        moe_inter = _int(text, "moe_intermediate_size", where=where)
        shared = _int(text, "n_shared_experts", 0, where=where, low=0)
        freq = _int(text, "moe_layer_freq", 1, where=where)
        expert_params = 3 * moe_inter * H
        moe_mlp = [
            Part("routed_experts", moe_inter, H, 2 * experts),  # each expert's gate_proj, up_proj
            Part("routed_experts", H, moe_inter, experts),  # each expert's down_proj
            Part("router", experts, H, shard="replicated", linear=False),  # gate
        ]
        if text.get("topk_method") == "noaux_tc":  # sigmoid scoring's correction bias, kept in fp32
            moe_mlp.append(Part("router", experts, shard="replicated", linear=False, element_bytes=4))
        if shared:
            moe_mlp += [Part("shared_experts", moe_inter * shared, H, 2), Part("shared_experts", H, moe_inter * shared)]
        tp_checks.append((moe_inter, "expert intermediate size"))
    for i in range(L):
        # DeepSeek's rule (modeling_deepseek.py): MoE from layer first_k_dense_replace on, every moe_layer_freq-th.
        if experts and i >= first_dense and i % freq == 0:
            layers.append(attention + moe_mlp)
            moe_layers += 1
            idle += experts - topk
        else:
            layers.append(attention + dense_mlp)
    if moe_layers < L:
        tp_checks.append((inter, "dense MLP intermediate size"))

    notes = [
        f"{text_arch} (MLA): {L} layers, hidden {H}, {heads} heads (q/k {nope}+{rope} rope, v {v_dim}), "
        f"q_lora_rank {q_lora if q_lora is not None else 'null (one q_proj)'}, kv_lora_rank {kv_lora}, "
        f"vocabulary {vocab}" + (", embeddings tied to the LM head" if tied else ""),
        f"MLA caches per token and layer the KV latent and the rope key: ({kv_lora} + {rope}) x dtype bytes, "
        f"for all {heads} heads at once; the cache does not grow with heads",
    ]
    if experts:
        notes.append(
            f"MoE: {moe_layers} of {L} layers route to {topk} of {experts} experts (intermediate {moe_inter}) "
            f"plus {shared} shared; the other {L - moe_layers} are dense (intermediate {inter}); each router has "
            f"a {experts} x {H} gate"
            + (" and an fp32 correction bias" if text.get("topk_method") == "noaux_tc" else "")
        )
    mtp = text.get("num_nextn_predict_layers") or 0
    if isinstance(mtp, int) and mtp > 0:
        notes.append(
            f"not counted: the checkpoint's {mtp} multi-token-prediction layer{'s' * (mtp > 1)} (an extra "
            "decoder layer plus eh_proj), which serving without MTP speculation does not load"
        )
    shape = Shape(
        architecture=arch,
        text_architecture=text_arch,
        attention="mla",
        head_parts=[Part("embeddings", vocab, H, shard="vocab", linear=False)],
        layers=layers,
        tail_parts=[
            Part("norms", H, shard="replicated", linear=False),
            Part("lm_head", vocab, H, shard="vocab", linear=False, tied=tied),
        ],
        kv_elements_per_layer=kv_lora + rope,
        num_heads=heads,
        num_kv_heads=1,
        head_dim=kv_lora + rope,
        config_dtype=_config_dtype(config, text),
        context=_max_context(text, where),
        routed_expert_params=expert_params,
        routed_experts_idle_per_token=idle,
        tp_checks=tp_checks,
        quantization=_quantization_from_config(config, text),
        has_routed_experts=bool(moe_layers),
        notes=notes,
    )
    return shape


def _moonvit_parts(vision: dict) -> tuple[list[Part], str] | None:
    """Kimi K2.5's MoonViT tower and patch-merger projector, from its `vt_*` keys (None for other
    vision configs). The time position embedding is fixed (no weights)."""
    if not isinstance(vision, dict) or "vt_hidden_size" not in vision:
        return None
    w = "config.vision_config"
    h = _int(vision, "vt_hidden_size", where=w)
    inter = _int(vision, "vt_intermediate_size", where=w)
    blocks = _int(vision, "vt_num_hidden_layers", where=w)
    patch = _int(vision, "patch_size", where=w)
    pos_h = _int(vision, "init_pos_emb_height", where=w)
    pos_w = _int(vision, "init_pos_emb_width", where=w)
    mm = _int(vision, "mm_hidden_size", h, where=w)
    text_h = _int(vision, "text_hidden_size", where=w)
    kernel = vision.get("merge_kernel_size") or [2, 2]
    if not (isinstance(kernel, list) and len(kernel) == 2 and all(isinstance(k, int) and 0 < k < 64 for k in kernel)):
        raise PlanError(f"{w}.merge_kernel_size must be two small positive integers, got {kernel!r}"[:300])
    merged = mm * kernel[0] * kernel[1]

    def vision_part(rows: int, cols: int = 1, count: int = 1) -> Part:
        return Part("vision", rows, cols, count, shard="replicated", linear=False)

    parts = [
        vision_part(h, 3 * patch * patch),  # patch embedding (a convolution)
        vision_part(h),  # its bias
        vision_part(pos_h * pos_w, h),  # learned 2-D position embedding
        vision_part(3 * h, h, blocks),  # each block's wqkv
        vision_part(h, h, blocks),  # wo
        vision_part(inter, h, blocks),  # fc0
        vision_part(h, inter, blocks),  # fc1
        vision_part(3 * h + h + inter + h, count=blocks),  # their biases
        vision_part(h, count=4 * blocks),  # two layer norms a block (weight and bias)
        vision_part(h, count=2),  # the final layer norm
        vision_part(mm, count=2),  # the projector's pre-norm
        vision_part(merged, merged),  # projector: merged patches ...
        vision_part(merged),
        vision_part(text_h, merged),  # ... to the text model's width
        vision_part(text_h),
    ]
    note = (
        f"vision: MoonViT, {blocks} blocks of {h} (MLP {inter}), {patch}x{patch} patches, and a "
        f"{kernel[0]}x{kernel[1]} patch-merger projector to {text_h}; counted in params_total and the weights "
        "(unquantized, whole on every device of the first stage), not in params_active (it runs on images)"
    )
    return parts, note


def read_shape(config: object) -> Shape:
    if not isinstance(config, dict):
        raise PlanError(f"config must be a config.json object, got {type(config).__name__}")
    arch, text, text_arch, where = _text_config(config)
    shape = (_mla_shape if text_arch in MLA_ARCHITECTURES else _dense_shape)(config, text, arch, text_arch, where)
    if where != "config":
        shape.notes.insert(0, f"{arch}: the decoder is {text_arch} under text_config")
        vision = config.get("vision_config")
        moonvit = _moonvit_parts(vision) if isinstance(vision, dict) else None
        if moonvit:
            shape.head_parts += moonvit[0]
            shape.notes.append(moonvit[1])
        elif isinstance(vision, dict):
            shape.notes.append("not counted: the vision tower (its vision_config is not one the planner sizes)")
    return shape


# -- pricing parts ------------------------------------------------------------------------------
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def part_bytes(part: Part, quant: Quantization, dtype_bytes: int) -> int:
    """The bytes of `part` as stored: fp8 linear weights at one byte plus an fp32 scale per block;
    int4 routed experts packed eight to an int32 plus a bf16 scale per group of inputs."""
    if part.element_bytes:
        return part.params * part.element_bytes
    if quant.name == "fp8" and part.linear:
        bo, bi = quant.block
        return part.count * (part.rows * part.cols + _cdiv(part.rows, bo) * _cdiv(part.cols, bi) * 4)
    if quant.name == "int4-experts" and part.linear and part.group == "routed_experts":
        return part.count * (part.rows * _cdiv(part.cols, 8) * 4 + part.rows * _cdiv(part.cols, quant.group_size) * 2)
    return part.params * dtype_bytes


def device_share(part: Part, whole: int, tp: int, kv_heads: int) -> int:
    """What one tensor-parallel rank holds of `whole` bytes of `part`."""
    if part.shard == "replicated" or tp == 1:
        return whole
    if part.shard == "vocab":  # vocabulary-parallel: ceil(vocab / tp) rows on each rank
        return _cdiv(whole * _cdiv(part.rows, tp), part.rows)
    if part.shard == "kv":  # KV heads split; with fewer heads than ranks each rank keeps one
        return _cdiv(whole * max(kv_heads // tp, 1), kv_heads)
    return _cdiv(whole, tp)


def stage_layers(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """[first, last) layers of each pipeline stage, as vLLM splits them (get_pp_indices): evenly,
    the remainder going to the stages before the last (which also holds the LM head)."""
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


# -- the plan -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    device_memory_bytes: int | None = None
    memory_fraction: float = ENGINE_MEMORY_FRACTION
    context_tokens: int | None = None
    quantization: str | None = None  # None: what the config says
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"


def _resolve_quantization(shape: Shape, requested: str | None) -> Quantization:
    found = shape.quantization
    if requested is None:
        return found
    if requested not in QUANTIZATIONS:
        raise PlanError(
            f"quantization must be one of {', '.join(QUANTIZATIONS)}; got {requested!r}"[:300], "quantization"
        )
    if requested == "int4-experts" and not shape.has_routed_experts:
        raise PlanError(
            f"quantization 'int4-experts' packs routed experts, and {shape.text_architecture} as "
            "configured has none (a dense model): choose none or fp8",
            "quantization",
        )
    if requested == found.name:
        return found
    if requested == "fp8":
        return Quantization("fp8", "request", description="requested fp8: e4m3 weights with 128x128 block scales")
    if requested == "int4-experts":
        return Quantization(
            "int4-experts",
            "request",
            description=f"requested int4-experts: routed experts packed int4, group size {INT4_GROUP}",
        )
    return Quantization("none", "request", description="requested none: unquantized weights")


def _check_tp(shape: Shape, tp: int, quant: Quantization) -> None:
    for size, what in shape.tp_checks:
        if size % tp:
            raise PlanError(
                f"tensor_parallel {tp} does not divide the {size} {what}: each rank must hold an equal share",
                "tensor_parallel",
            )
    kv = shape.num_kv_heads
    if shape.attention != "mla" and (kv % tp if kv >= tp else tp % kv):
        raise PlanError(
            f"tensor_parallel {tp} and the {kv} KV heads do not split evenly: with at least as many "
            "KV heads as ranks tp must divide them, with fewer the heads must divide tp (each is then "
            "replicated)",
            "tensor_parallel",
        )
    mlp_sizes = [(size, what) for size, what in shape.tp_checks if "intermediate" in what]
    for size, what in mlp_sizes:
        shard = size // tp
        if quant.name == "fp8" and shard % quant.block[0]:
            raise PlanError(
                f"with fp8 {quant.block[0]}x{quant.block[1]} blocks, tensor_parallel {tp} leaves "
                f"{shard} of the {size} {what} per rank, not a whole number of blocks",
                "tensor_parallel",
            )
        if quant.name == "int4-experts" and what == "expert intermediate size" and shard % quant.group_size:
            raise PlanError(
                f"with int4 groups of {quant.group_size}, tensor_parallel {tp} leaves {shard} of the "
                f"{size} {what} per rank, not a whole number of groups",
                "tensor_parallel",
            )


def _dtype(name: str, default: str, field: str) -> str:
    name = str(name).lower()
    if name == "auto":
        return default
    if name not in DTYPE_BYTES:
        raise PlanError(f"{field} must be auto or one of {', '.join(sorted(DTYPE_BYTES))}; got {name!r}"[:300], field)
    return CANONICAL_DTYPE.get(name, name)


def _gib(n: int) -> str:
    return f"{n / 1e9:,.2f} GB ({n / (1 << 30):,.2f} GiB)"


def plan(config: object, layout: Layout) -> dict:
    """The capacity plan of `config` on `layout`, as the API answers it (see api/serializers)."""
    shape = read_shape(config)
    tp, pp = layout.tensor_parallel, layout.pipeline_parallel
    if not 1 <= tp <= 4096:
        raise PlanError(f"tensor_parallel must be between 1 and 4096, got {tp}", "tensor_parallel")
    if not 1 <= pp <= len(shape.layers):
        raise PlanError(
            f"pipeline_parallel {pp} must be between 1 and the model's {len(shape.layers)} layers", "pipeline_parallel"
        )
    quant = _resolve_quantization(shape, layout.quantization)
    _check_tp(shape, tp, quant)
    dtype = _dtype(layout.dtype, shape.config_dtype, "dtype")
    dtype_bytes = DTYPE_BYTES[dtype]
    if layout.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise PlanError(
            f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}; got {layout.kv_cache_dtype!r}"[:300],
            "kv_cache_dtype",
        )
    kv_dtype = dtype if layout.kv_cache_dtype == "auto" else "fp8_e4m3"
    kv_bytes = dtype_bytes if layout.kv_cache_dtype == "auto" else 1
    context = layout.context_tokens or shape.context

    params = dict.fromkeys(GROUPS, 0)
    weights = dict.fromkeys(GROUPS, 0)
    all_parts = shape.head_parts + [p for layer in shape.layers for p in layer] + shape.tail_parts
    for part in all_parts:
        if not part.tied:
            params[part.group] += part.params
            weights[part.group] += part_bytes(part, quant, dtype_bytes)
    params_total = sum(params.values())
    params_active = params_total - params["vision"] - shape.routed_experts_idle_per_token * shape.routed_expert_params
    kv_per_token = len(shape.layers) * shape.kv_elements_per_layer * kv_bytes

    # Per device: each pipeline stage's share of its parts, on each of its tp ranks.
    if shape.attention == "mla":
        kv_per_layer_device = shape.kv_elements_per_layer * kv_bytes  # the latent: replicated on every rank
    else:
        kv_per_layer_device = 2 * max(shape.num_kv_heads // tp, 1) * shape.head_dim * kv_bytes

    def stage_bytes(first: int, last: int, index: int, replicate_attention: bool = False) -> int:
        parts = [p for layer in shape.layers[first:last] for p in layer]
        if index == 0:
            parts = shape.head_parts + parts
        if index == pp - 1:
            # A tied LM head reuses the embedding on one stage; a later stage holds its own copy.
            parts += [p for p in shape.tail_parts if not p.tied or pp > 1]
        total = 0
        for part in parts:
            share = "replicated" if replicate_attention and part.group == "attention" else part.shard
            placed = part if share == part.shard else replace(part, shard=share)
            total += device_share(placed, part_bytes(part, quant, dtype_bytes), tp, shape.num_kv_heads)
        return total

    usable = int(layout.device_memory_bytes * layout.memory_fraction) if layout.device_memory_bytes else None
    stages = []
    for index, (first, last) in enumerate(stage_layers(len(shape.layers), pp)):
        on_device = stage_bytes(first, last, index)
        kv_device = (last - first) * kv_per_layer_device
        free = usable - on_device if usable is not None else None
        tokens = max(free, 0) // kv_device if free is not None and kv_device else None
        stages.append(
            {
                "stage": index,
                "first_layer": first,
                "last_layer": last - 1,
                "weight_bytes_per_device": on_device,
                "kv_bytes_per_token_per_device": kv_device,
                "free_bytes_per_device": free,
                "max_kv_tokens": tokens,
            }
        )
    per_device = max(s["weight_bytes_per_device"] for s in stages)
    kv_device = max(s["kv_bytes_per_token_per_device"] for s in stages)
    free = None if usable is None else min(s["free_bytes_per_device"] for s in stages)
    max_tokens = None if usable is None else min(s["max_kv_tokens"] for s in stages)
    fits = None if usable is None else free > 0

    notes = [*shape.notes, _quant_note(quant, dtype)]
    notes.append(
        f"weights: {_gib(weights_total := sum(weights.values()))} in all; per device, {_placement_note(shape, tp, pp)}"
    )
    notes.append(
        f"KV cache: {kv_per_token:,} bytes per token for the whole model ({kv_dtype}); "
        + (
            f"MLA's latent is replicated on each of the {tp} tensor-parallel ranks (not split by heads), so each "
            f"device holds {kv_device:,} bytes per token of its stage's layers"
            if shape.attention == "mla"
            else f"KV heads are split across the {tp} tensor-parallel rank{'s' * (tp > 1)}"
            + (" (fewer KV heads than ranks: each rank keeps a replica of one)" if shape.num_kv_heads < tp else "")
            + f", {kv_device:,} bytes per token per device"
        )
    )
    if usable is None:
        notes.append(
            "no device memory: give device_memory_bytes (or register a node with CUDA devices) for "
            "free memory, KV tokens and batch"
        )
    else:
        notes.append(
            f"free per device = {layout.device_memory_bytes:,} x memory_fraction {layout.memory_fraction} "
            f"= {usable:,} usable - {per_device:,} of weights = {free:,} bytes (no other reserve is subtracted: "
            "the fraction leaves the rest of the device to activations, CUDA graphs and the runtime, as the "
            "engine's gpu_memory_utilization does)"
        )
        notes.append(
            f"max_kv_tokens = free / KV bytes per token per device = {max_tokens:,} tokens for the replica; "
            f"max_batch_at_context = max_kv_tokens // {context:,} context tokens"
            + ("; with pipeline stages, each figure is the tightest stage's (see stages)" if pp > 1 else "")
        )
        if not fits:
            notes.append(
                f"does not fit: {per_device:,} bytes of weights per device exceed the {usable:,} usable "
                f"({layout.device_memory_bytes:,} x {layout.memory_fraction})"
            )

    dp = None
    if shape.attention == "mla" and tp > 1:
        replicated = max(
            stage_bytes(first, last, index, replicate_attention=True)
            for index, (first, last) in enumerate(stage_layers(len(shape.layers), pp))
        )
        dp_free = usable - replicated if usable is not None else None
        dp = {
            "max_kv_tokens": None if max_tokens is None else max_tokens * tp,
            "max_batch_at_context": None if max_tokens is None else max_tokens * tp // context,
            "weight_bytes_per_device_replicated_attention": replicated,
            "free_bytes_per_device_replicated_attention": dp_free,
            "max_kv_tokens_replicated_attention": None if dp_free is None else max(dp_free, 0) // kv_device * tp,
        }
        notes.append(
            f"attention data-parallel (the alternative for MLA): each of the {tp} ranks caches the latent of its "
            f"own sequences instead of a replica of all, so the same free memory holds {tp}x the tokens; running "
            "attention that way also replicates the attention weights on every rank (as SGLang's DP attention "
            "does), which costs memory: see the *_replicated_attention figures"
        )
    return {
        "architecture": shape.architecture,
        "text_architecture": shape.text_architecture,
        "attention": shape.attention,
        "quantization": quant.name,
        "quantization_source": quant.source,
        "dtype": dtype,
        "kv_cache_dtype": kv_dtype,
        "tensor_parallel": tp,
        "pipeline_parallel": pp,
        "device_memory_bytes": layout.device_memory_bytes,
        "memory_fraction": layout.memory_fraction,
        "context_tokens": context,
        "params_total": params_total,
        "params_active": params_active,
        "params": params,
        "weight_bytes_total": weights_total,
        "weight_bytes": weights,
        "weight_bytes_per_device": per_device,
        "kv_bytes_per_token": kv_per_token,
        "kv_bytes_per_token_per_device": kv_device,
        "usable_bytes_per_device": usable,
        "free_bytes_per_device": free,
        "fits": fits,
        "max_kv_tokens": max_tokens,
        "max_batch_at_context": None if max_tokens is None else max_tokens // context,
        "stages": stages,
        "attention_data_parallel": dp,
        "notes": notes,
    }


def _quant_note(quant: Quantization, dtype: str) -> str:
    if quant.name == "fp8":
        return (
            f"{quant.description}: every decoder linear weight at 1 byte plus an fp32 scale per "
            f"{quant.block[0]}x{quant.block[1]} block (as DeepSeek-V3 ships); embeddings, LM head, norms and "
            f"router gates in {dtype}, the router's correction bias in fp32"
        )
    if quant.name == "int4-experts":
        return (
            f"{quant.description}: each routed expert weight packed 8 to an int32 (0.5 byte) plus a bf16 "
            f"scale per {quant.group_size} inputs; everything else (attention, dense and shared MLPs, "
            f"embeddings, LM head, router) in {dtype}"
        )
    return f"{quant.description}; weights in {dtype}"


def _placement_note(shape: Shape, tp: int, pp: int) -> str:
    text = (
        f"tensor parallel {tp}: attention projections split by heads, MLPs and each expert by intermediate "
        "size, embeddings and LM head by vocabulary rows (ceil(vocab / tp) each); norms and router gates "
        "whole on every rank"
    )
    if shape.attention == "mla":
        text += "; MLA's down-projections to the latents (q_a_proj, kv_a_proj_with_mqa) whole on every rank, as vLLM"
    elif shape.num_kv_heads < tp:
        text += f"; K/V projections: one of the {shape.num_kv_heads} KV heads per rank"
    if pp > 1:
        text += (
            f"; pipeline parallel {pp}: layers split evenly (the remainder to the stages before the last), "
            "embeddings (and a vision tower) on the first stage, final norm and LM head on the last; "
            "weight_bytes_per_device is the largest stage's"
        )
    return text
