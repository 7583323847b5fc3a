"""What one token's KV cache entry is, per model family; the model runner allocates by it.

The cache is one tensor [layers, parts, blocks, block_size, heads, width]:

* dense (Llama, Mistral, Qwen): parts 2 (keys, values), heads = KV heads, width = head_dim.
* mla (DeepSeek-V3, Kimi K2): parts 1, heads 1, width = kv_lora_rank + qk_rope_head_dim: the
  normalised KV latent and the rotated rope key, shared by every attention head. Keys and
  values are rebuilt from it (prefill) or never built at all (absorbed decode; layers/mla.py).

The block manager counts blocks, not bytes; KV transfer and the tiers move `parts` segments per
layer and block (workers/kvtransfer/layout.py), so one layout rule serves both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.engine.config import ModelConfig


@dataclass(frozen=True)
class KVLayout:
    kind: str  # "dense" | "mla"
    num_layers: int
    parts: int
    heads: int
    width: int

    def shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (self.num_layers, self.parts, num_blocks, block_size, self.heads, self.width)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """The whole model's cache bytes for one token (every layer)."""
        return self.num_layers * self.parts * self.heads * self.width * dtype.itemsize

    def bytes_per_block(self, block_size: int, dtype: torch.dtype) -> int:
        return block_size * self.bytes_per_token(dtype)


def kv_layout_for(cfg: ModelConfig) -> KVLayout:
    if cfg.mla is not None:
        width = cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim
        return KVLayout("mla", cfg.num_layers, 1, 1, width)
    return KVLayout("dense", cfg.num_layers, 2, cfg.num_kv_heads, cfg.head_dim)
