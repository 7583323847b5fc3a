"""Model and engine configuration.

`ModelConfig` normalises a Hugging Face `config.json` (both the transformers 4.x `rope_scaling`
and the 5.x `rope_parameters` spellings) into the handful of numbers the engine needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from workers.engine.errors import ModelLoadError
from workers.protocol.architectures import MLA_ARCHITECTURES
from workers.protocol.model_files import architecture, max_context, read_config, sliding_window
from workers.protocol.quantization import QuantConfig, quantization_config

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(set(DTYPES))}") from None


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"  # "default" | "llama3" | "yarn"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    # yarn (DeepSeek-V3, Kimi K2): the ramp between extrapolated and interpolated frequencies,
    # and the magnitude scales (layers/rotary.py: yarn_attention_factor, yarn_softmax_scale).
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    # Longest context served exactly: within a sliding window, full attention is exact
    # (model_files.max_context: the gateway's check uses the same rule).
    max_context: int
    rope: RopeConfig
    tie_word_embeddings: bool
    attention_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    torch_dtype: str = "float32"
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    bos_token_id: int | None = None
    # DeepseekV3ForCausalLM only (models/deepseek_v3.py): latent attention and experts.
    mla: MLAConfig | None = None
    moe: MoEConfig | None = None
    # Which linear layers hold int4 / fp8 weights (None: a dense checkpoint).
    quantization: QuantConfig | None = None

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        return cls.from_dict(read_config(model_dir), source=str(Path(model_dir) / "config.json"))

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> ModelConfig:
        arch = architecture(raw, source)
        quant = quantization_config(raw, source)
        try:
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            head_dim = raw.get("head_dim") or hidden // heads
            eos = raw.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
            model_type = raw.get("model_type", "")
            fields = dict(
                architecture=arch,
                model_type=model_type,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(head_dim),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                max_context=max_context(raw),
                rope=rope_from(raw),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                attention_bias=bool(raw.get("attention_bias", arch == "Qwen2ForCausalLM")),
                qk_norm=arch == "Qwen3ForCausalLM",
                sliding_window=sliding_window(raw),
                torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
                eos_token_ids=eos_ids,
                bos_token_id=raw.get("bos_token_id"),
                quantization=quant,
            )
            if arch in MLA_ARCHITECTURES:
                fields.update(deepseek_parts(raw, source))
            return cls(**fields)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{source}: missing or invalid field {exc}") from exc


def rope_from(raw: dict) -> RopeConfig:
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind not in ("default", "llama3", "yarn"):
        raise ModelLoadError(f"rope type {kind!r} is not supported; supported: default, llama3, yarn")
    if kind != "yarn":
        return RopeConfig(
            theta=theta,
            kind=kind,
            factor=float(params.get("factor", 1.0)),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position=int(params.get("original_max_position_embeddings", 8192)),
        )
    # transformers' defaults: the original context is the config's own unless named, and a
    # missing factor is the ratio of the two.
    positions = int(raw.get("max_position_embeddings", 2048))
    original = int(params.get("original_max_position_embeddings") or positions)
    factor = params.get("factor")

    def optional(key):
        return None if params.get(key) is None else float(params[key])

    return RopeConfig(
        theta=theta,
        kind=kind,
        factor=float(factor) if factor is not None else positions / original,
        original_max_position=original,
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        mscale=optional("mscale"),
        mscale_all_dim=optional("mscale_all_dim"),
        attention_factor=optional("attention_factor"),
        truncate=bool(params.get("truncate", True)),
    )


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention: queries through an optional low-rank `q_lora_rank`, keys and
    values through one shared latent of `kv_lora_rank` plus a rope key of `qk_rope_head_dim`."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool  # the checkpoint's rope dimensions come in (even, odd) pairs


@dataclass(frozen=True)
class MoEConfig:
    """DeepSeek-V3 routed + shared experts, from layer `first_k_dense_replace` on."""

    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    first_k_dense_replace: int
    moe_layer_freq: int

    def is_moe_layer(self, index: int) -> bool:
        return index >= self.first_k_dense_replace and index % self.moe_layer_freq == 0


def deepseek_parts(raw: dict, source: str) -> dict:
    """The ModelConfig fields a DeepseekV3 config adds; what the engine cannot run is refused."""
    if raw.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"{source}: hidden_act {raw['hidden_act']!r} is not supported (silu only)")
    if raw.get("scoring_func", "sigmoid") != "sigmoid":
        raise ModelLoadError(f"{source}: scoring_func {raw['scoring_func']!r} is not supported (sigmoid only)")
    if raw.get("topk_method", "noaux_tc") != "noaux_tc":
        raise ModelLoadError(f"{source}: topk_method {raw['topk_method']!r} is not supported (noaux_tc only)")
    if raw.get("attention_bias"):
        raise ModelLoadError(f"{source}: attention_bias is not supported for DeepseekV3ForCausalLM")
    q_lora = raw.get("q_lora_rank")
    mla = MLAConfig(
        q_lora_rank=int(q_lora) if q_lora else None,
        kv_lora_rank=int(raw["kv_lora_rank"]),
        qk_nope_head_dim=int(raw["qk_nope_head_dim"]),
        qk_rope_head_dim=int(raw["qk_rope_head_dim"]),
        v_head_dim=int(raw["v_head_dim"]),
        rope_interleave=bool(raw.get("rope_interleave", True)),
    )
    experts = int(raw["n_routed_experts"])
    n_group = int(raw.get("n_group") or 1)
    moe = MoEConfig(
        n_routed_experts=experts,
        n_shared_experts=int(raw.get("n_shared_experts") or 0),
        num_experts_per_tok=int(raw["num_experts_per_tok"]),
        moe_intermediate_size=int(raw["moe_intermediate_size"]),
        n_group=n_group,
        topk_group=int(raw.get("topk_group") or n_group),
        norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
        routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
        first_k_dense_replace=int(raw.get("first_k_dense_replace") or 0),
        moe_layer_freq=int(raw.get("moe_layer_freq") or 1),
    )
    if experts % n_group or not 0 < moe.topk_group <= n_group or moe.num_experts_per_tok > experts:
        raise ModelLoadError(
            f"{source}: {experts} experts in {n_group} groups, topk_group {moe.topk_group}, "
            f"num_experts_per_tok {moe.num_experts_per_tok} do not fit together"
        )
    return {
        "mla": mla,
        "moe": moe,
        "head_dim": mla.qk_nope_head_dim + mla.qk_rope_head_dim,
        "num_kv_heads": int(raw["num_attention_heads"]),
    }


@dataclass
class EngineConfig:
    """How the engine runs a model: sizes of the batch and of the KV cache."""

    model: str
    device: str = "cpu"
    dtype: str = "auto"
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    # KV memory budget: a fraction of device memory on CUDA, bytes on CPU.
    gpu_memory_utilization: float = 0.85
    kv_cache_bytes: int = 1 << 30
    num_kv_blocks: int | None = None  # overrides the budget (tests force preemption with it)
    seed: int = 0
    # Within a priority, admit the tenant that got the least service first (fair_share.py);
    # False: first come, first served.
    fair_share: bool = True
    # vLLM's spelling, e.g. {"method": "ngram", "num_speculative_tokens": 3}; speculative/config.py.
    speculative_config: dict | None = None
    # KV tiers behind the device cache, e.g. {"dram_bytes": 1 << 30}; tiered_cache.KVTierConfig.
    kv_tiers: dict | None = None
    # One replica over several ranks (parallel/): vLLM's names; stages as layer counts.
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    pipeline_stages: tuple[int, ...] | None = None
    parallel_timeout_s: float = 30.0
    parallel_threads_per_rank: int | None = None  # CPU: None shares the cores evenly
