"""Paged attention over one layer's KV cache, for a batch mixing prefill chunks and decodes.

The batch is laid out prefill tokens first, then one token per decoding sequence; the
`AttentionMetadata` built by the model runner says where each part is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from workers.engine import kernels


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [tokens] cache slot each new token's K/V goes to
    num_prefill_tokens: int
    # prefill part
    prefill_block_tables: torch.Tensor | None = None
    prefill_cu_q_lens: torch.Tensor | None = None
    prefill_context_lens: torch.Tensor | None = None
    prefill_plan: list | None = None  # torch path: `kernels.plan_prefill`, built once per step
    # decode part
    decode_block_tables: torch.Tensor | None = None
    decode_context_lens: torch.Tensor | None = None
    decode_plan: list | None = None  # torch path: `kernels.plan_decode`, built once per step


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        # Views into the engine's KV cache tensor, bound by the model runner.
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def bind_kv_cache(self, cache: torch.Tensor) -> None:
        """`cache`: this layer's [2, blocks, block_size, kv_heads, head_dim] (kv_layout.py)."""
        self.k_cache, self.v_cache = cache[0], cache[1]

    def forward(self, q, k, v, meta: AttentionMetadata) -> torch.Tensor:
        kernels.write_kv(k, v, self.k_cache, self.v_cache, meta.slot_mapping)
        p = meta.num_prefill_tokens
        if p == q.shape[0]:
            return self._prefill(q, meta)
        if p == 0:
            return self._decode(q, meta)
        return torch.cat((self._prefill(q[:p], meta), self._decode(q[p:], meta)))

    def _prefill(self, q, meta):
        return kernels.paged_prefill(
            q,
            self.k_cache,
            self.v_cache,
            meta.prefill_block_tables,
            meta.prefill_cu_q_lens,
            meta.prefill_context_lens,
            self.scale,
            meta.prefill_plan,
        )

    def _decode(self, q, meta):
        return kernels.paged_decode(
            q,
            self.k_cache,
            self.v_cache,
            meta.decode_block_tables,
            meta.decode_context_lens,
            self.scale,
            meta.decode_plan,
        )
