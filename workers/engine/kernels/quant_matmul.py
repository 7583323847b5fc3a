"""Matrix products with quantized weights: y = x @ dequant(W).T, W [out, in] kept compressed.

- int4 (compressed-tensors pack-quantized): `packed` int32 [out, ceil(in/8)], value j of a row
  in bits 4·(j%8) of word j//8, stored as q + 8 (q in [-8, 7]); `scale` [out, ceil(in/g)];
  W[n, k] = q[n, k] · scale[n, k // g].
- fp8 (DeepSeek-V3): `weight` float8_e4m3fn [out, in]; `scale_inv` float32
  [ceil(out/bn), ceil(in/bk)]; W[n, k] = weight[n, k] · scale_inv[n // bn, k // bk]. Edge
  blocks are partial.

The torch references dequantize the whole matrix, then multiply (the CPU path). The triton
kernels dequantize one tile at a time in registers, so only the compressed bytes are read.
"""

import torch

from workers.engine.kernels._triton import jit, tl

_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q int [rows, cols] in [-8, 7] → int32 [rows, ceil(cols/8)] in compressed-tensors' order."""
    rows, cols = q.shape
    if q.numel() and (q.min() < -8 or q.max() > 7):
        raise ValueError("int4 values must lie in [-8, 7]")
    pad = -cols % 8
    u = torch.nn.functional.pad(q.to(torch.int32) + 8, (0, pad))  # padding packs as code 0
    words = u.view(rows, -1, 8) << _SHIFTS.to(q.device)
    # The eight fields are disjoint, so a sum is their bitwise or; the top field sets the sign
    # bit, and int32 wraps around in two's complement as the stored word does.
    return words.sum(dim=-1, dtype=torch.int32)


def unpack_int4(packed: torch.Tensor, cols: int) -> torch.Tensor:
    """The inverse of `pack_int4`: int8 [rows, cols] in [-8, 7]."""
    return (_codes(packed)[:, :cols] - 8).to(torch.int8)


def _codes(packed: torch.Tensor) -> torch.Tensor:
    # A little-endian int32 is four bytes, each holding two values: value 2i in the low nibble
    # of byte i, value 2i + 1 in the high one. Working on bytes reads a quarter of the data
    # shifting each int32 eight times would.
    b = packed.contiguous().view(torch.uint8)
    return torch.stack((b & 0xF, b >> 4), dim=-1).view(packed.shape[0], -1)


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, group_size: int, cols: int, dtype) -> torch.Tensor:
    rows, groups = scale.shape
    codes = _codes(packed)
    width = groups * group_size
    if codes.shape[1] < width:  # code 8 is the value 0
        codes = torch.nn.functional.pad(codes, (0, width - codes.shape[1]), value=8)
    w = (codes[:, :width].view(rows, groups, group_size).to(dtype) - 8) * scale.to(dtype)[..., None]
    return w.view(rows, width)[:, :cols]


def dequantize_fp8_block(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], dtype) -> torch.Tensor:
    rows, cols = weight.shape
    s = scale_inv.repeat_interleave(block[0], dim=0)[:rows].repeat_interleave(block[1], dim=1)[:, :cols]
    return (weight.to(torch.float32) * s).to(dtype)


def int4_matmul_ref(x, packed, scale, group_size: int, cols: int):
    return x @ dequantize_int4(packed, scale, group_size, cols, x.dtype).t()


def fp8_block_matmul_ref(x, weight, scale_inv, block: tuple[int, int]):
    return x @ dequantize_fp8_block(weight, scale_inv, block, x.dtype).t()


@jit
def _int4_matmul_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_sn, stride_om, group_size,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        xmask = (rm[:, None] < M) & (rk[None, :] < K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=xmask, other=0.0)
        wmask = (rk[:, None] < K) & (rn[None, :] < N)
        # The weight tile as [BLOCK_K, BLOCK_N]: each column is one output row's words.
        words = tl.load(w_ptr + rn[None, :] * stride_wn + (rk[:, None] // 8), mask=wmask, other=0)
        q = ((words >> ((rk[:, None] % 8) * 4)) & 0xF) - 8
        s = tl.load(s_ptr + rn[None, :] * stride_sn + (rk[:, None] // group_size), mask=wmask, other=0.0)
        w = (q.to(tl.float32) * s.to(tl.float32)).to(x.dtype)
        acc += tl.dot(x, w)
    omask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=omask)


@jit
def _fp8_block_matmul_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_sn, stride_om, block_n, block_k,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        xmask = (rm[:, None] < M) & (rk[None, :] < K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=xmask, other=0.0)
        wmask = (rk[:, None] < K) & (rn[None, :] < N)
        w8 = tl.load(w_ptr + rn[None, :] * stride_wn + rk[:, None], mask=wmask, other=0.0)
        s = tl.load(s_ptr + (rn[None, :] // block_n) * stride_sn + (rk[:, None] // block_k), mask=wmask, other=0.0)
        w = (w8.to(tl.float32) * s).to(x.dtype)
        acc += tl.dot(x, w)
    omask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=omask)


def _prepare(x, n):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    return x2, torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)


def int4_matmul_triton(x, packed, scale, group_size: int, cols: int, block_m=16, block_n=64, block_k=64):
    n = packed.shape[0]
    packed, scale = packed.contiguous(), scale.contiguous()
    x2, out = _prepare(x, n)
    m = x2.shape[0]
    if m:
        grid = (-(-m // block_m), -(-n // block_n))
        _int4_matmul_kernel[grid](
            x2, packed, scale, out, m, n, cols, x2.stride(0), packed.stride(0), scale.stride(0), out.stride(0),
            group_size, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        )  # fmt: skip
    return out.view(*x.shape[:-1], n)


def fp8_block_matmul_triton(x, weight, scale_inv, block: tuple[int, int], block_m=16, block_n=64, block_k=64):
    n, cols = weight.shape
    weight, scale_inv = weight.contiguous(), scale_inv.contiguous()
    x2, out = _prepare(x, n)
    m = x2.shape[0]
    if m:
        grid = (-(-m // block_m), -(-n // block_n))
        _fp8_block_matmul_kernel[grid](
            x2, weight, scale_inv, out, m, n, cols, x2.stride(0), weight.stride(0), scale_inv.stride(0), out.stride(0),
            block[0], block[1], BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        )  # fmt: skip
    return out.view(*x.shape[:-1], n)
