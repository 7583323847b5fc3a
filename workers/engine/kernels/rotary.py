"""Rotary position embedding (the "rotate half" / NeoX layout that Llama and Qwen use).

`cos_sin` holds each token's row of the [max_positions, head_dim] fp32 table (cos in the first
half, sin in the second): the model gathers the rows once per step, not once per layer.
"""

import torch

from workers.engine.kernels._triton import jit, next_pow2, tl


def apply_rotary_ref(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, head_dim] (any strides), cos_sin: [tokens, head_dim]; returns a new
    contiguous tensor."""
    half = x.shape[-1] // 2
    cs = cos_sin.to(x.dtype)
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    x1, x2 = x[..., :half], x[..., half:]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    torch.mul(x1, cos, out=out[..., :half]).addcmul_(x2, sin, value=-1)  # x1 cos - x2 sin
    torch.mul(x2, cos, out=out[..., half:]).addcmul_(x1, sin)  # x2 cos + x1 sin
    return out


@jit
def _rotary_kernel(x_ptr, cs_ptr, out_ptr, n_heads, HALF: tl.constexpr, BLOCK: tl.constexpr):
    tok = tl.program_id(0)
    head = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    mask = offs < HALF
    cos = tl.load(cs_ptr + tok * 2 * HALF + offs, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptr + tok * 2 * HALF + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    base = (tok * n_heads + head) * 2 * HALF
    x1 = tl.load(x_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    ty = out_ptr.dtype.element_ty
    tl.store(out_ptr + base + offs, (x1 * cos - x2 * sin).to(ty), mask=mask)
    tl.store(out_ptr + base + HALF + offs, (x2 * cos + x1 * sin).to(ty), mask=mask)


def apply_rotary_triton(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    tokens, heads, dim = x.shape
    if tokens:
        _rotary_kernel[(tokens, heads)](x, cos_sin.contiguous(), out, heads, HALF=dim // 2, BLOCK=next_pow2(dim // 2))
    return out
