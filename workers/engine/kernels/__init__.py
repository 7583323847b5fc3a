"""Compute kernels: a torch reference for each op, and a triton kernel used on CUDA.

Callers use the dispatching functions below; they pick triton for CUDA tensors and the torch
reference everywhere else. `SWITCHYARD_KERNELS=torch` forces the reference on CUDA too.
"""

import os

import torch
import torch.nn.functional as F

from workers.engine.kernels import quant_matmul
from workers.engine.kernels._triton import HAS_TRITON
from workers.engine.kernels.activation import silu_and_mul_ref, silu_and_mul_triton
from workers.engine.kernels.kv_write import write_kv_ref, write_kv_triton
from workers.engine.kernels.mla import mla_decode_ref, mla_decode_triton
from workers.engine.kernels.paged_attention import (
    paged_decode_ref,
    paged_decode_triton,
    paged_prefill_ref,
    paged_prefill_triton,
    plan_decode,
    plan_prefill,
)
from workers.engine.kernels.rmsnorm import rms_norm_ref, rms_norm_triton
from workers.engine.kernels.rotary import apply_rotary_ref, apply_rotary_triton

_FORCE_TORCH = os.environ.get("SWITCHYARD_KERNELS", "") == "torch"


def use_triton(t: torch.Tensor) -> bool:
    return t.is_cuda and HAS_TRITON and not _FORCE_TORCH


def rms_norm(x, weight, eps):
    if use_triton(x):
        return rms_norm_triton(x, weight, eps)
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        # torch's fused op: the reference's arithmetic in one call (bit-identical in fp32 here),
        # 14 us instead of 21 us a row on this CPU, and a decode step has 2 per layer.
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return rms_norm_ref(x, weight, eps)


def silu_and_mul(x):
    return silu_and_mul_triton(x) if use_triton(x) else silu_and_mul_ref(x)


def apply_rotary(x, cos_sin):
    return apply_rotary_triton(x, cos_sin) if use_triton(x) else apply_rotary_ref(x, cos_sin)


def write_kv(k, v, k_cache, v_cache, slot_mapping):
    fn = write_kv_triton if use_triton(k) else write_kv_ref
    fn(k, v, k_cache, v_cache, slot_mapping)


def paged_decode(q, k_cache, v_cache, block_tables, context_lens, scale, plan=None):
    fn = paged_decode_triton if use_triton(q) else paged_decode_ref
    return fn(q, k_cache, v_cache, block_tables, context_lens, scale, plan)


def paged_prefill(q, k_cache, v_cache, block_tables, cu_q_lens, context_lens, scale, plan=None):
    fn = paged_prefill_triton if use_triton(q) else paged_prefill_ref
    return fn(q, k_cache, v_cache, block_tables, cu_q_lens, context_lens, scale, plan)


def mla_decode(q, cache, block_tables, context_lens, kv_lora_rank, scale, plan=None):
    fn = mla_decode_triton if use_triton(q) else mla_decode_ref
    return fn(q, cache, block_tables, context_lens, kv_lora_rank, scale, plan)


def int4_linear(x, packed, scale, group_size, cols):
    if use_triton(x):
        return quant_matmul.int4_matmul_triton(x, packed, scale, group_size, cols)
    return quant_matmul.int4_matmul_ref(x, packed, scale, group_size, cols)


def fp8_block_linear(x, weight, scale_inv, block):
    if use_triton(x):
        return quant_matmul.fp8_block_matmul_triton(x, weight, scale_inv, block)
    return quant_matmul.fp8_block_matmul_ref(x, weight, scale_inv, block)


__all__ = [
    "apply_rotary",
    "fp8_block_linear",
    "int4_linear",
    "mla_decode",
    "paged_decode",
    "paged_prefill",
    "plan_decode",
    "plan_prefill",
    "quant_matmul",
    "rms_norm",
    "silu_and_mul",
    "use_triton",
    "write_kv",
]
