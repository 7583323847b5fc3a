"""SiLU-and-mul: the gated MLP activation, silu(gate) * up over a fused [gate | up] tensor."""

import torch
import torch.nn.functional as F

from workers.engine.kernels._triton import jit, tl


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


@jit
def _silu_and_mul_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    gate = tl.load(x_ptr + row * 2 * n + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * n + n + cols, mask=mask, other=0.0)
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * n + cols, act * up, mask=mask)


def silu_and_mul_triton(x: torch.Tensor, block: int = 1024) -> torch.Tensor:
    shape = x.shape
    n = shape[-1] // 2
    x2 = x.reshape(-1, shape[-1]).contiguous()
    out = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        _silu_and_mul_kernel[(x2.shape[0], -(-n // block))](x2, out, n, BLOCK=block)
    return out.view(*shape[:-1], n)
