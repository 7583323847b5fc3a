"""Rotary position embedding (the "rotate half" / NeoX layout that Llama and Qwen use).

`cos_sin` is a [max_positions, head_dim] fp32 table: cos in the first half, sin in the second.
"""

import torch

from workers.engine.kernels._triton import jit, next_pow2, tl


def apply_rotary_ref(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, head_dim]; returns a new tensor."""
    half = x.shape[-1] // 2
    cs = cos_sin[positions].to(x.dtype)
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


@jit
def _rotary_kernel(x_ptr, pos_ptr, cs_ptr, out_ptr, n_heads, HALF: tl.constexpr, BLOCK: tl.constexpr):
    tok = tl.program_id(0)
    head = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    mask = offs < HALF
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    cos = tl.load(cs_ptr + pos * 2 * HALF + offs, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptr + pos * 2 * HALF + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    base = (tok * n_heads + head) * 2 * HALF
    x1 = tl.load(x_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    ty = out_ptr.dtype.element_ty
    tl.store(out_ptr + base + offs, (x1 * cos - x2 * sin).to(ty), mask=mask)
    tl.store(out_ptr + base + HALF + offs, (x2 * cos + x1 * sin).to(ty), mask=mask)


def apply_rotary_triton(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    tokens, heads, dim = x.shape
    if tokens:
        _rotary_kernel[(tokens, heads)](
            x, positions.contiguous(), cos_sin.contiguous(), out, heads, HALF=dim // 2, BLOCK=next_pow2(dim // 2)
        )
    return out
