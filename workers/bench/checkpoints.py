"""Random-weight checkpoints with real models' shapes, generated offline and cached on disk."""

from __future__ import annotations

import os
from pathlib import Path

# SmolLM-135M's shape (Llama architecture, tied embeddings).
SMOLLM_135M_SHAPE = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    tie_word_embeddings=True,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
)


def cache_dir() -> Path:
    root = os.environ.get("SWITCHYARD_CACHE") or Path.home() / ".cache" / "switchyard"
    return Path(root)


def random_checkpoint(name: str = "smollm-135m-shape", shape: dict | None = None, seed: int = 0) -> Path:
    """Create (once) a random Llama checkpoint of `shape`; returns its directory."""
    target = cache_dir() / "checkpoints" / name
    if (target / "model.safetensors").is_file():
        return target
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(**(shape or SMOLLM_135M_SHAPE), initializer_range=0.05, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg)
    tmp = target.with_name(target.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tmp.rename(target)
    return target
