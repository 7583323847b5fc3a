"""Linear layers whose weights stay compressed in memory, and the factory models build their
linear layers with.

`make_linear(quant, prefixes, in_features, out_features, bias)` returns a dense `Linear` where
the checkpoint's quantization config leaves that layer dense, else an `Int4PackedLinear`
(compressed-tensors pack-quantized) or an `Fp8BlockLinear` (DeepSeek-V3 fp8). A fused layer
(q/k/v → qkv_proj) names each checkpoint module it stacks, in row order, with its row count;
all of them must share one format.

A quantized layer holds its checkpoint tensors as buffers (so `to_empty`/`.to()` move them) and
loads them itself: `checkpoint_tensors()` lists the names it expects with the rows each fills,
`load_tensor` copies one in. `forward` calls the quantized matmul (kernels: a triton kernel on
CUDA that dequantizes tile by tile, dequantize-then-matmul in torch elsewhere).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from workers.engine import kernels
from workers.engine.errors import ModelLoadError
from workers.engine.layers.linear import Linear
from workers.protocol.quantization import QuantConfig, WeightScheme


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class QuantizedLinear(nn.Module):
    """What the two formats share: the checkpoint modules stacked in this layer, their rows, bias."""

    suffixes: tuple[str, ...] = ()

    def __init__(self, prefixes: Sequence[str], in_features: int, sizes: Sequence[int], bias: bool):
        super().__init__()
        self.prefixes, self.sizes = tuple(prefixes), tuple(sizes)
        self.in_features, self.out_features = in_features, sum(sizes)
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        self.part_rows = tuple((a, a + n) for a, n in zip(starts, sizes, strict=True))
        self.bias = nn.Parameter(torch.empty(self.out_features)) if bias else None

    def checkpoint_tensors(self) -> dict[str, tuple[str, tuple[int, int]]]:
        """Checkpoint tensor name → (suffix, the output rows its module fills). The bias is a
        parameter and loads as a dense one does."""
        return {
            f"{prefix}.{suffix}": (suffix, rows)
            for prefix, rows in zip(self.prefixes, self.part_rows, strict=True)
            for suffix in self.suffixes
        }

    def _check(self, name: str, tensor: torch.Tensor, dest: torch.Tensor) -> None:
        if tuple(tensor.shape) != tuple(dest.shape):
            raise ModelLoadError(
                f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}"
            )

    def _check_shape(self, name: str, tensor: torch.Tensor, rows: tuple[int, int]) -> None:
        expected = [rows[1] - rows[0], self.in_features]
        if tensor.numel() != 2 or tensor.flatten().tolist() != expected:
            raise ModelLoadError(f"checkpoint tensor {name!r} is {tensor.flatten().tolist()}, expected {expected}")

    def prepare(self) -> None:
        pass

    def dequantized(self) -> torch.Tensor:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, parts={self.prefixes}"


class Int4PackedLinear(QuantizedLinear):
    """compressed-tensors pack-quantized int4: `weight_packed` int32 [out, ceil(in/8)],
    `weight_scale` [out, ceil(in/group_size)] (kept in the model dtype), `weight_shape` checked."""

    suffixes = ("weight_packed", "weight_scale", "weight_shape")

    def __init__(self, prefixes, in_features, sizes, bias, group_size: int):
        super().__init__(prefixes, in_features, sizes, bias)
        self.group_size = group_size
        self.register_buffer("weight_packed", torch.empty(self.out_features, _cdiv(in_features, 8), dtype=torch.int32))
        self.register_buffer("weight_scale", torch.empty(self.out_features, _cdiv(in_features, group_size)))

    @torch.no_grad()
    def load_tensor(self, name: str, suffix: str, tensor: torch.Tensor, rows: tuple[int, int]) -> None:
        if suffix == "weight_shape":
            return self._check_shape(name, tensor, rows)
        dest = getattr(self, suffix)[rows[0] : rows[1]]
        self._check(name, tensor, dest)
        if suffix == "weight_packed" and tensor.dtype != torch.int32:
            raise ModelLoadError(f"checkpoint tensor {name!r} is {tensor.dtype}, expected torch.int32")
        dest.copy_(tensor)

    def dequantized(self) -> torch.Tensor:
        return kernels.quant_matmul.dequantize_int4(
            self.weight_packed, self.weight_scale, self.group_size, self.in_features, self.weight_scale.dtype
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = kernels.int4_linear(x, self.weight_packed, self.weight_scale, self.group_size, self.in_features)
        return y if self.bias is None else y + self.bias


class Fp8BlockLinear(QuantizedLinear):
    """DeepSeek-V3 fp8: `weight` float8_e4m3fn [out, in] and `weight_scale_inv` float32, one per
    block. A fused layer whose parts do not start on block rows keeps one scale row per weight
    row instead (the scale of the block the row came from): 4 bytes per 128 weights more."""

    suffixes = ("weight", "weight_scale_inv")

    def __init__(self, prefixes, in_features, sizes, bias, block: tuple[int, int]):
        super().__init__(prefixes, in_features, sizes, bias)
        self.block = block
        self.row_block = block[0] if all(n % block[0] == 0 for n in sizes[:-1]) else 1
        self.register_buffer("weight", torch.empty(self.out_features, in_features, dtype=torch.float8_e4m3fn))
        self.register_buffer(
            "weight_scale_inv",
            torch.empty(_cdiv(self.out_features, self.row_block), _cdiv(in_features, block[1]), dtype=torch.float32),
        )

    @torch.no_grad()
    def load_tensor(self, name: str, suffix: str, tensor: torch.Tensor, rows: tuple[int, int]) -> None:
        a, b = rows
        if suffix == "weight":
            if tensor.dtype != torch.float8_e4m3fn:
                raise ModelLoadError(f"checkpoint tensor {name!r} is {tensor.dtype}, expected torch.float8_e4m3fn")
            dest = self.weight[a:b]
            self._check(name, tensor, dest)
            dest.copy_(tensor)
            return
        expected = (_cdiv(b - a, self.block[0]), _cdiv(self.in_features, self.block[1]))
        if tuple(tensor.shape) != expected:
            raise ModelLoadError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, expected {expected}")
        if self.row_block == 1:
            self.weight_scale_inv[a:b].copy_(tensor.repeat_interleave(self.block[0], dim=0)[: b - a])
        else:
            self.weight_scale_inv[a // self.row_block : _cdiv(b, self.row_block)].copy_(tensor)

    @property
    def scale_block(self) -> tuple[int, int]:
        return (self.row_block, self.block[1])

    def dequantized(self) -> torch.Tensor:
        qm = kernels.quant_matmul
        return qm.dequantize_fp8_block(self.weight, self.weight_scale_inv, self.scale_block, torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = kernels.fp8_block_linear(x, self.weight, self.weight_scale_inv, self.scale_block)
        return y if self.bias is None else y + self.bias


def make_linear(
    quant: QuantConfig | None,
    prefixes: str | Sequence[str],
    in_features: int,
    out_features: int | Sequence[int],
    bias: bool = False,
) -> nn.Module:
    """The linear layer for checkpoint module(s) `prefixes` (full names, e.g.
    "model.layers.3.mlp.experts.7.down_proj"): dense, int4 or fp8 as `quant` says. For a fused
    layer pass the stacked modules and their row counts: prefixes=(q, k, v), out_features=(nq, nk, nv)."""
    prefixes = (prefixes,) if isinstance(prefixes, str) else tuple(prefixes)
    sizes = (out_features,) if isinstance(out_features, int) else tuple(out_features)
    if len(prefixes) != len(sizes):
        raise ValueError("make_linear: one row count per prefix")
    schemes = {quant.scheme_for(p) if quant else None for p in prefixes}
    if len(schemes) > 1:
        raise ModelLoadError(
            f"quantization_config gives the modules fused into one layer different formats: {', '.join(prefixes)}"
        )
    scheme: WeightScheme | None = schemes.pop()
    if scheme is None:
        return Linear(in_features, sum(sizes), bias=bias)
    if scheme.kind == "int4":
        return Int4PackedLinear(prefixes, in_features, sizes, bias, scheme.group_size)
    return Fp8BlockLinear(prefixes, in_features, sizes, bias, scheme.block)


def prepare_linears(model: nn.Module) -> None:
    """After loading: every linear layer's `prepare` (dense: the CPU's transposed copy,
    layers/linear.py; quantized: nothing yet), the step every model's loader ends with."""
    for module in model.modules():
        if isinstance(module, (Linear, QuantizedLinear)):
            module.prepare()


def quantized_tensor_layout(model: nn.Module) -> dict[str, tuple[QuantizedLinear, str, tuple[int, int]]]:
    """Every checkpoint tensor the model's quantized layers expect → (layer, suffix, rows), for
    a model's `load_weights`."""
    layout = {}
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            for name, (suffix, rows) in module.checkpoint_tensors().items():
                layout[name] = (module, suffix, rows)
    return layout
