"""RMSNorm: y = w * (x / sqrt(mean(x^2) + eps)), statistics in fp32 (as transformers does)."""

import torch

from workers.engine.kernels._triton import jit, next_pow2, tl


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=0) / n_cols
    y = (x * tl.rsqrt(var + eps)).to(out_ptr.dtype.element_ty)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * n_cols + cols, w * y, mask=mask)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    out = torch.empty_like(x2)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, weight, out, x2.shape[1], eps, BLOCK=next_pow2(x2.shape[1]))
    return out.view(shape)
