"""Attention over the paged KV cache.

Two entry points, each defined by a torch reference and mirrored by a triton kernel:

* `paged_decode_*`: one query token per sequence (the decode step), attending to the
  sequence's whole context through its block table.
* `paged_prefill_*`: a chunk of query tokens per sequence (a prompt, or a chunk of one after a
  cached prefix), attending causally to the cached prefix plus the chunk itself.

Shapes: q [tokens, heads, head_dim]; caches [num_blocks, block_size, kv_heads, head_dim];
block_tables [seqs, max_blocks] (int32, padded with any valid block id); context_lens [seqs]
(tokens in the cache, the new ones included); for prefill `cu_q_lens` [seqs + 1] gives each
sequence's query range in q.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from workers.engine.kernels._triton import jit, next_pow2, tl


def _gather(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """[n_blocks] block ids → the contiguous [n_blocks * block_size, kv_heads, head_dim] rows."""
    return cache.index_select(0, blocks).flatten(0, 1)


@dataclass
class DecodeGroup:
    """Sequences of similar context length, attended together padded to the longest of them."""

    rows: torch.Tensor | None  # their indices in the batch; None: the whole batch, in order
    blocks: torch.Tensor  # [seqs * n_blocks] each sequence's first n_blocks block ids, flattened
    n_blocks: int
    mask: torch.Tensor  # [seqs, 1, 1, n_blocks * block_size]: 0 inside the context, -inf past it


def plan_decode(block_tables, context_lens, block_size: int, dtype: torch.dtype) -> list[DecodeGroup]:
    """The part of decode attention that is the same in every layer, so a step builds it once.
    Sequences of very different lengths go in separate groups, so that one long context does not
    make every short one in the batch pay for its length."""
    lens = context_lens.tolist()
    order = sorted(range(len(lens)), key=lens.__getitem__)
    groups, current = [], [order[0]]
    for i in order[1:]:
        if lens[i] > 2 * lens[current[0]] + 64:  # more than ~half would be padding: new group
            groups.append(current)
            current = [i]
        else:
            current.append(i)
    groups.append(current)
    plan = []
    for group in groups:
        rows = None if len(groups) == 1 else torch.tensor(group, device=context_lens.device)
        tables = block_tables if rows is None else block_tables[rows]
        ctx = context_lens if rows is None else context_lens[rows]
        n_blocks = -(-max(lens[i] for i in group) // block_size)
        pos = torch.arange(n_blocks * block_size, device=ctx.device)
        mask = torch.zeros(len(group), 1, 1, pos.numel(), dtype=dtype, device=ctx.device)
        mask.masked_fill_((pos[None, :] >= ctx[:, None]).view(len(group), 1, 1, -1), float("-inf"))
        plan.append(DecodeGroup(rows, tables[:, :n_blocks].reshape(-1), n_blocks, mask))
    return plan


def paged_decode_ref(q, k_cache, v_cache, block_tables, context_lens, scale: float, plan=None) -> torch.Tensor:
    """`plan`: this step's `plan_decode(...)`, when the caller made it once for all layers."""
    if plan is None:
        plan = plan_decode(block_tables, context_lens, k_cache.shape[1], q.dtype)
    if len(plan) == 1 and plan[0].rows is None:
        return _decode_group(q, k_cache, v_cache, plan[0], scale)
    out = torch.empty_like(q)
    for group in plan:
        out[group.rows] = _decode_group(q[group.rows], k_cache, v_cache, group, scale)
    return out


def _decode_group(q, k_cache, v_cache, group: DecodeGroup, scale: float) -> torch.Tensor:
    seqs, heads, dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    # One gather of each sequence's blocks, [seqs, T, kv_heads, dim], seen as [seqs, kv_heads, T, dim]
    # without a copy. index_select copies ~2x faster than advanced indexing here, and SDPA reads the
    # strided view directly (a matmul would copy it again: half the step at batch 32 on CPU).
    shape = (seqs, group.n_blocks * block_size, kv_heads, dim)
    k = k_cache.index_select(0, group.blocks).view(shape).transpose(1, 2)
    v = v_cache.index_select(0, group.blocks).view(shape).transpose(1, 2)
    # GQA: a kv head's query heads are that head's "query tokens" [seqs, kv_heads, group, dim].
    qg = q.view(seqs, kv_heads, heads // kv_heads, dim)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=group.mask.to(q.dtype), scale=scale)
    return out.reshape(seqs, heads, dim)


@dataclass
class PrefillChunk:
    """One sequence's query chunk in a prefill step, as every layer attends it."""

    start: int  # its queries are rows start..end of q
    end: int
    blocks: torch.Tensor  # [n_blocks] (int64) the blocks holding its context
    context_len: int  # tokens in the cache, the chunk's own included
    # [chunk, context] causal mask after cached context (boolean, or additive for a short chunk);
    # None: none cached
    mask: torch.Tensor | None


# A chunk of at most this many queries gets an additive mask (0 / -inf in the attention's dtype):
# SDPA on CPU turns a boolean mask into one in every layer (a verify step's chunk paid ~5 us a
# layer for it), while a long chunk's additive mask would hold 2-4x the bytes of a boolean one
# (bf16-fp32) all step.
ADDITIVE_MASK_MAX_QUERIES = 32


def plan_prefill(block_tables, cu_q_lens, context_lens, block_size: int, dtype: torch.dtype) -> list[PrefillChunk]:
    """The part of prefill attention that is the same in every layer (block ids, the causal
    mask of a chunk that follows cached context), so a step builds it once: a verify step's
    short chunk costs per layer little more than a decode does."""
    starts, ctxs = cu_q_lens.tolist(), context_lens.tolist()
    device = block_tables.device
    plan = []
    for i, ctx in enumerate(ctxs):
        n_q = starts[i + 1] - starts[i]
        mask = None
        if n_q != ctx:
            qpos = torch.arange(ctx - n_q, ctx, device=device)
            mask = torch.arange(ctx, device=device)[None, :] <= qpos[:, None]
            if n_q <= ADDITIVE_MASK_MAX_QUERIES:
                mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, float("-inf"))
        blocks = block_tables[i, : -(-ctx // block_size)].long()
        plan.append(PrefillChunk(starts[i], starts[i + 1], blocks, ctx, mask))
    return plan


def paged_prefill_ref(
    q, k_cache, v_cache, block_tables, cu_q_lens, context_lens, scale: float, plan=None
) -> torch.Tensor:
    """`plan`: this step's `plan_prefill(...)`, when the caller made it once for all layers."""
    if plan is None:
        plan = plan_prefill(block_tables, cu_q_lens, context_lens, k_cache.shape[1], q.dtype)
    if len(plan) == 1:  # one sequence: its output is the whole output
        return _prefill_chunk(q, k_cache, v_cache, plan[0], scale).contiguous()
    out = torch.empty_like(q)
    for chunk in plan:
        out[chunk.start : chunk.end] = _prefill_chunk(q[chunk.start : chunk.end], k_cache, v_cache, chunk, scale)
    return out


def _prefill_chunk(qs, k_cache, v_cache, chunk: PrefillChunk, scale: float) -> torch.Tensor:
    heads, kv_heads = qs.shape[1], k_cache.shape[2]
    k = _gather(k_cache, chunk.blocks)[: chunk.context_len]
    v = _gather(v_cache, chunk.blocks)[: chunk.context_len]
    if chunk.mask is None:
        if kv_heads != heads:
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
        # 4-D [1, heads, tokens, dim]: on CPU, 3-D inputs miss SDPA's fused kernel (~6x slower).
        qt, kt, vt = (x.transpose(0, 1)[None] for x in (qs, k, v))
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale)
    else:
        # A chunk after cached context (chunked prefill, speculative verification): SDPA's
        # own GQA reads the kv heads in place, bit-identical to repeating them and 1.5-4x
        # faster for short chunks on CPU (the repeat had been most of a verify step's extra).
        qt, kt, vt = (x.transpose(0, 1)[None] for x in (qs, k, v))
        o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=chunk.mask, scale=scale, enable_gqa=kv_heads != heads)
    return o[0].transpose(0, 1)


@jit
def _decode_kernel(
    q_ptr,
    kc_ptr,
    vc_ptr,
    bt_ptr,
    ctx_ptr,
    out_ptr,
    scale,
    max_blocks,
    n_heads,
    n_kv_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // (n_heads // n_kv_heads)
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    t = tl.arange(0, BLOCK_SIZE)
    q = tl.load(q_ptr + (seq * n_heads + head) * HEAD_DIM + d, mask=dmask, other=0.0).to(tl.float32)
    ctx = tl.load(ctx_ptr + seq)
    m_i = -1e30
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    row_stride = n_kv_heads * HEAD_DIM
    for j in range(0, tl.cdiv(ctx, BLOCK_SIZE)):
        block = tl.load(bt_ptr + seq * max_blocks + j).to(tl.int64)
        pos = j * BLOCK_SIZE + t
        valid = pos < ctx
        offs = (block * BLOCK_SIZE + t)[:, None] * row_stride + kv_head * HEAD_DIM + d[None, :]
        m2 = valid[:, None] & dmask[None, :]
        k = tl.load(kc_ptr + offs, mask=m2, other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale
        s = tl.where(valid, s, -1e30)
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        p = tl.where(valid, p, 0.0)
        v = tl.load(vc_ptr + offs, mask=m2, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    out = acc / l_i
    tl.store(out_ptr + (seq * n_heads + head) * HEAD_DIM + d, out.to(out_ptr.dtype.element_ty), mask=dmask)


def paged_decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale: float, plan=None) -> torch.Tensor:
    """`plan` is the torch reference's; the kernel needs none."""
    seqs, heads, dim = q.shape
    out = torch.empty_like(q)
    _decode_kernel[(seqs, heads)](
        q.contiguous(),
        k_cache,
        v_cache,
        block_tables.contiguous(),
        context_lens.contiguous(),
        out,
        scale,
        block_tables.shape[1],
        heads,
        k_cache.shape[2],
        HEAD_DIM=dim,
        BLOCK_D=next_pow2(dim),
        BLOCK_SIZE=k_cache.shape[1],
    )
    return out


@jit
def _prefill_kernel(
    q_ptr,
    kc_ptr,
    vc_ptr,
    bt_ptr,
    cuq_ptr,
    ctx_ptr,
    out_ptr,
    scale,
    max_blocks,
    n_heads,
    n_kv_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    mblk = tl.program_id(2)
    q_start = tl.load(cuq_ptr + seq)
    q_len = tl.load(cuq_ptr + seq + 1) - q_start
    if mblk * BLOCK_M < q_len:
        kv_head = head // (n_heads // n_kv_heads)
        ctx = tl.load(ctx_ptr + seq)
        m_idx = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
        m_valid = m_idx < q_len
        q_pos = ctx - q_len + m_idx
        d = tl.arange(0, BLOCK_D)
        dmask = d < HEAD_DIM
        q_offs = ((q_start + m_idx) * n_heads + head)[:, None] * HEAD_DIM + d[None, :]
        q = tl.load(q_ptr + q_offs, mask=m_valid[:, None] & dmask[None, :], other=0.0)
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - 1e30
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        t = tl.arange(0, BLOCK_SIZE)
        row_stride = n_kv_heads * HEAD_DIM
        # The last query of this tile sees keys up to its own position.
        last = tl.minimum(ctx - q_len + (mblk + 1) * BLOCK_M, ctx)
        for j in range(0, tl.cdiv(last, BLOCK_SIZE)):
            block = tl.load(bt_ptr + seq * max_blocks + j).to(tl.int64)
            k_pos = j * BLOCK_SIZE + t
            k_offs = (block * BLOCK_SIZE + t)[:, None] * row_stride + kv_head * HEAD_DIM + d[None, :]
            kmask = (k_pos < ctx)[:, None] & dmask[None, :]
            k = tl.load(kc_ptr + k_offs, mask=kmask, other=0.0)
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
            allowed = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] < ctx)
            s = tl.where(allowed, s, -1e30)
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            p = tl.where(allowed, p, 0.0)
            v = tl.load(vc_ptr + k_offs, mask=kmask, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + q_offs, out.to(out_ptr.dtype.element_ty), mask=m_valid[:, None] & dmask[None, :])


def paged_prefill_triton(
    q, k_cache, v_cache, block_tables, cu_q_lens, context_lens, scale: float, plan=None, block_m: int = 16
) -> torch.Tensor:
    """`plan` is the torch reference's; the kernel needs none."""
    block_size = k_cache.shape[1]
    if block_size < 16:
        raise ValueError(f"the triton prefill kernel needs block_size >= 16 (got {block_size})")
    seqs = context_lens.shape[0]
    heads, dim = q.shape[1], q.shape[2]
    out = torch.empty_like(q)
    max_q = int((cu_q_lens[1:] - cu_q_lens[:-1]).max())
    grid = (seqs, heads, -(-max_q // block_m))
    _prefill_kernel[grid](
        q.contiguous(),
        k_cache,
        v_cache,
        block_tables.contiguous(),
        cu_q_lens.contiguous(),
        context_lens.contiguous(),
        out,
        scale,
        block_tables.shape[1],
        heads,
        k_cache.shape[2],
        HEAD_DIM=dim,
        BLOCK_D=max(16, next_pow2(dim)),
        BLOCK_M=block_m,
        BLOCK_SIZE=block_size,
    )
    return out
