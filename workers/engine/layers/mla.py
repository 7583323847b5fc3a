"""Multi-head latent attention (DeepSeek-V2/V3, Kimi K2) over the paged latent cache.

Per token the cache keeps the normalised KV latent c (kv_lora_rank) and the rotated rope key
k_pe (qk_rope_head_dim), not per-head keys and values (kv_layout.py). From them:

* prefill (and chunks after a cached prefix, and speculative verification) expands: keys
  [k_nope, k_pe] and values come from W_UKV · c for the whole context, then causal attention;
* decode is absorbed: W_UK is folded into the query, q_lat = q_nope · W_UK, so the scores are
  [q_lat, q_pe] · [c, k_pe] over the latent rows themselves; attention returns a latent per
  head, which W_UV turns into that head's value (kernels/mla.py).

Both equal transformers' DeepseekV3Attention (which always expands); the absorbed form reads
(C + R) values per cached token instead of heads · (nope + rope + v).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from workers.engine import kernels
from workers.engine.config import ModelConfig
from workers.engine.layers.attention import AttentionMetadata
from workers.engine.layers.norm import RMSNorm
from workers.engine.layers.rotary import yarn_softmax_scale

LinearFactory = Callable[[int, int, str], nn.Module]  # (in, out, checkpoint name) → a linear layer


def dense_weight(linear: nn.Module) -> torch.Tensor:
    """The [out, in] weight of a linear layer, dequantized when it is a quantized one."""
    dequantized = getattr(linear, "dequantized", None)  # QuantizedLinear.dequantized
    return dequantized() if callable(dequantized) else linear.weight


class MLAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, linear: LinearFactory, prefix: str = ""):
        super().__init__()
        mla = cfg.mla
        self.num_heads = cfg.num_heads
        self.nope, self.rope, self.v_dim = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
        self.kv_lora_rank = mla.kv_lora_rank
        self.qk_dim = self.nope + self.rope
        if mla.q_lora_rank is None:
            self.q_proj = linear(cfg.hidden_size, self.num_heads * self.qk_dim, f"{prefix}q_proj")
        else:
            self.q_a_proj = linear(cfg.hidden_size, mla.q_lora_rank, f"{prefix}q_a_proj")
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, 1e-6)  # transformers' default eps here
            self.q_b_proj = linear(mla.q_lora_rank, self.num_heads * self.qk_dim, f"{prefix}q_b_proj")
        self.kv_a_proj_with_mqa = linear(cfg.hidden_size, self.kv_lora_rank + self.rope, f"{prefix}kv_a_proj_with_mqa")
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, 1e-6)
        self.kv_b_proj = linear(self.kv_lora_rank, self.num_heads * (self.nope + self.v_dim), f"{prefix}kv_b_proj")
        self.o_proj = linear(self.num_heads * self.v_dim, cfg.hidden_size, f"{prefix}o_proj")
        self.scale = yarn_softmax_scale(cfg.rope, self.qk_dim**-0.5)
        # Checkpoints lay rope dimensions out in (even, odd) pairs; this order makes them the
        # halves the rotary kernel turns (the same dot products, since q and k both move).
        self.interleaved = mla.rope_interleave
        self.register_buffer("rope_order", torch.empty(0, dtype=torch.long), persistent=False)  # materialize
        self.cache: torch.Tensor | None = None  # [blocks, block_size, C + R], bound by the runner
        self.w_uk: torch.Tensor | None = None  # [heads, nope, C]  (prepare())
        self.w_uv_t: torch.Tensor | None = None  # [heads, C, v]

    def bind_kv_cache(self, cache: torch.Tensor) -> None:
        """`cache`: this layer's [1, blocks, block_size, 1, C + R] (kv_layout.py)."""
        self.cache = cache[0, :, :, 0]

    def prepare(self) -> None:
        """After loading: W_UK and W_UV, split out of kv_b_proj, for the absorbed decode."""
        w = dense_weight(self.kv_b_proj).detach().to(self.kv_a_layernorm.weight.dtype)  # fp8 dequantizes to fp32
        w = w.view(self.num_heads, self.nope + self.v_dim, self.kv_lora_rank)
        self.w_uk = w[:, : self.nope].contiguous()
        self.w_uv_t = w[:, self.nope :].transpose(1, 2).contiguous()

    def materialize(self, device: torch.device) -> None:
        self.rope_order = torch.cat((torch.arange(0, self.rope, 2), torch.arange(1, self.rope, 2))).to(device)

    def _rotate(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        if self.interleaved:
            x = x.index_select(-1, self.rope_order)
        return kernels.apply_rotary(x, rope)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        if hasattr(self, "q_proj"):
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(-1, self.num_heads, self.qk_dim)
        q_nope, q_pe = q.split((self.nope, self.rope), dim=-1)
        q_pe = self._rotate(q_pe, rope)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split((self.kv_lora_rank, self.rope), dim=-1)
        k_pe = self._rotate(k_pe[:, None], rope)[:, 0]
        entry = torch.cat((self.kv_a_layernorm(latent.contiguous()), k_pe), dim=-1)
        self.cache.view(-1, entry.shape[-1]).index_copy_(0, meta.slot_mapping, entry.to(self.cache.dtype))
        p = meta.num_prefill_tokens
        if p == q.shape[0]:
            out = self._prefill(q_nope, q_pe, meta)
        elif p == 0:
            out = self._decode(q_nope, q_pe, meta)
        else:
            out = torch.cat((self._prefill(q_nope[:p], q_pe[:p], meta), self._decode(q_nope[p:], q_pe[p:], meta)))
        return self.o_proj(out.reshape(-1, self.num_heads * self.v_dim))

    def _prefill(self, q_nope, q_pe, meta: AttentionMetadata) -> torch.Tensor:
        """Expanded: each sequence's context latents → keys and values, causal attention."""
        q = torch.cat((q_nope, q_pe), dim=-1)
        out = torch.empty(q.shape[0], self.num_heads, self.v_dim, dtype=q.dtype, device=q.device)
        block_size = self.cache.shape[1]
        starts = meta.prefill_cu_q_lens.tolist()
        for i, ctx in enumerate(meta.prefill_context_lens.tolist()):
            blocks = meta.prefill_block_tables[i, : -(-ctx // block_size)].long()
            rows = self.cache.index_select(0, blocks).flatten(0, 1)[:ctx]
            latent, k_pe = rows.split((self.kv_lora_rank, self.rope), dim=-1)
            kv = self.kv_b_proj(latent.contiguous()).view(ctx, self.num_heads, self.nope + self.v_dim)
            k_nope, v = kv.split((self.nope, self.v_dim), dim=-1)
            k = torch.cat((k_nope, k_pe[:, None].expand(ctx, self.num_heads, self.rope)), dim=-1)
            qs = q[starts[i] : starts[i + 1]]
            n_q = qs.shape[0]
            qt, kt, vt = (t.transpose(0, 1)[None] for t in (qs, k, v))
            if n_q == ctx:
                o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=self.scale)
            else:  # a chunk after cached context: each query sees the context up to itself
                qpos = torch.arange(ctx - n_q, ctx, device=q.device)
                mask = torch.arange(ctx, device=q.device)[None, :] <= qpos[:, None]
                o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=self.scale)
            out[starts[i] : starts[i + 1]] = o[0].transpose(0, 1)
        return out

    def _decode(self, q_nope, q_pe, meta: AttentionMetadata) -> torch.Tensor:
        """Absorbed: W_UK into the query, attention over the latent rows, W_UV after."""
        q_lat = torch.bmm(q_nope.transpose(0, 1), self.w_uk).transpose(0, 1)  # [seqs, heads, C]
        q = torch.cat((q_lat, q_pe), dim=-1)
        o_lat = kernels.mla_decode(
            q,
            self.cache,
            meta.decode_block_tables,
            meta.decode_context_lens,
            self.kv_lora_rank,
            self.scale,
            meta.decode_plan,
        )
        return torch.bmm(o_lat.transpose(0, 1), self.w_uv_t).transpose(0, 1)  # [seqs, heads, v]
