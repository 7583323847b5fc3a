"""Absorbed multi-head latent attention for decode, over the paged latent cache.

The cache holds per token one row of width C + R: the normalised KV latent (C = kv_lora_rank)
and the rotated rope key (R = qk_rope_head_dim), shared by every head. With W_UK folded into
the query beforehand (q = [q_nope · W_UK, q_rope], [seqs, heads, C + R]), attention is
multi-query attention with one key of width C + R whose value is the latent itself: the output
[seqs, heads, C] is a latent per head, which the caller turns into values with W_UV.

Shapes: q [seqs, heads, C + R]; cache [num_blocks, block_size, C + R]; block_tables [seqs,
max_blocks] int32; context_lens [seqs] (the new token included).
"""

import torch
import torch.nn.functional as F

from workers.engine.kernels._triton import jit, next_pow2, tl
from workers.engine.kernels.paged_attention import plan_decode


def mla_decode_ref(q, cache, block_tables, context_lens, kv_lora_rank: int, scale: float, plan=None) -> torch.Tensor:
    """`plan`: this step's `plan_decode(...)` when the caller made it once for all layers."""
    if plan is None:
        plan = plan_decode(block_tables, context_lens, cache.shape[1], q.dtype)
    out = torch.empty(*q.shape[:2], kv_lora_rank, dtype=q.dtype, device=q.device)
    for group in plan:
        rows = slice(None) if group.rows is None else group.rows
        qg = q[rows]
        seqs, width = qg.shape[0], cache.shape[-1]
        # [seqs, 1 (the one shared key), T, C + R]; the value is the latent part of the same rows.
        k = cache.index_select(0, group.blocks).view(seqs, 1, -1, width)
        v = k[..., :kv_lora_rank]
        o = F.scaled_dot_product_attention(qg[:, None], k, v, attn_mask=group.mask.to(q.dtype), scale=scale)
        out[rows] = o[:, 0]
    return out


@jit
def _mla_decode_kernel(
    q_ptr,
    c_ptr,
    bt_ptr,
    ctx_ptr,
    out_ptr,
    scale,
    max_blocks,
    n_heads,
    LORA: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # One program: one sequence, BLOCK_H heads. The latent is read once for all those heads.
    seq = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = h < n_heads
    c = tl.arange(0, BLOCK_C)
    cmask = c < LORA
    r = tl.arange(0, BLOCK_R)
    rmask = r < ROPE
    width = LORA + ROPE
    q_rows = (seq * n_heads + h) * width
    q_c = tl.load(q_ptr + q_rows[:, None] + c[None, :], mask=hmask[:, None] & cmask[None, :], other=0.0)
    q_r = tl.load(q_ptr + q_rows[:, None] + LORA + r[None, :], mask=hmask[:, None] & rmask[None, :], other=0.0)
    ctx = tl.load(ctx_ptr + seq)
    m_i = tl.zeros([BLOCK_H], dtype=tl.float32) - 1e30
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_C], dtype=tl.float32)
    t = tl.arange(0, BLOCK_SIZE)
    for j in range(0, tl.cdiv(ctx, BLOCK_SIZE)):
        block = tl.load(bt_ptr + seq * max_blocks + j).to(tl.int64)
        valid = j * BLOCK_SIZE + t < ctx
        rows = (block * BLOCK_SIZE + t) * width
        k_c = tl.load(c_ptr + rows[:, None] + c[None, :], mask=valid[:, None] & cmask[None, :], other=0.0)
        k_r = tl.load(c_ptr + rows[:, None] + LORA + r[None, :], mask=valid[:, None] & rmask[None, :], other=0.0)
        s = tl.dot(q_c, tl.trans(k_c), input_precision=PRECISION)
        s = (s + tl.dot(q_r, tl.trans(k_r), input_precision=PRECISION)).to(tl.float32) * scale
        s = tl.where(valid[None, :], s, -1e30)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.where(valid[None, :], tl.exp(s - m_new[:, None]), 0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(k_c.dtype), k_c, input_precision=PRECISION).to(tl.float32)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    out = acc / l_i[:, None]
    out_rows = (seq * n_heads + h) * LORA
    tl.store(
        out_ptr + out_rows[:, None] + c[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=hmask[:, None] & cmask[None, :],
    )


def mla_decode_triton(
    q, cache, block_tables, context_lens, kv_lora_rank: int, scale: float, plan=None, block_h: int = 16
) -> torch.Tensor:
    """`plan` is the torch reference's; the kernel needs none."""
    block_size = cache.shape[1]
    if block_size < 16:
        raise ValueError(f"the triton MLA decode kernel needs block_size >= 16 (got {block_size})")
    seqs, heads, width = q.shape
    rope = width - kv_lora_rank
    out = torch.empty(seqs, heads, kv_lora_rank, dtype=q.dtype, device=q.device)
    _mla_decode_kernel[(seqs, -(-heads // block_h))](
        q.contiguous(),
        cache,
        block_tables.contiguous(),
        context_lens.contiguous(),
        out,
        scale,
        block_tables.shape[1],
        heads,
        LORA=kv_lora_rank,
        ROPE=rope,
        BLOCK_C=max(16, next_pow2(kv_lora_rank)),
        BLOCK_R=max(16, next_pow2(rope)),
        BLOCK_H=block_h,
        BLOCK_SIZE=block_size,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32 stays fp32 (no tf32)
    )
    return out
