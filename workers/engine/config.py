"""Model and engine configuration.

`ModelConfig` normalises a Hugging Face `config.json` (both the transformers 4.x `rope_scaling`
and the 5.x `rope_parameters` spellings) into the handful of numbers the engine needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from workers.engine.errors import ModelLoadError
from workers.protocol.model_files import architecture, max_context, read_config, sliding_window

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
    kind: str = "default"  # "default" | "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


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

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        return cls.from_dict(read_config(model_dir), source=str(Path(model_dir) / "config.json"))

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> ModelConfig:
        arch = architecture(raw, source)
        try:
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            head_dim = raw.get("head_dim") or hidden // heads
            eos = raw.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
            model_type = raw.get("model_type", "")
            return cls(
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
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{source}: missing or invalid field {exc}") from exc


def rope_from(raw: dict) -> RopeConfig:
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind not in ("default", "llama3"):
        raise ModelLoadError(f"rope type {kind!r} is not supported; supported: default, llama3")
    return RopeConfig(
        theta=theta,
        kind=kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(params.get("original_max_position_embeddings", 8192)),
    )


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
    # vLLM's spelling, e.g. {"method": "ngram", "num_speculative_tokens": 3}; spec/config.py.
    speculative_config: dict | None = None
    # KV tiers behind the device cache, e.g. {"dram_bytes": 1 << 30}; tiered_cache.KVTierConfig.
    kv_tiers: dict | None = None
    # One replica over several ranks (parallel/): vLLM's names; stages as layer counts.
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    pipeline_stages: tuple[int, ...] | None = None
    parallel_timeout_s: float = 30.0
    parallel_threads_per_rank: int | None = None  # CPU: None shares the cores evenly
