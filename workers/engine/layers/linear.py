"""Linear layer with a CPU fast path.

At batch 1 a linear layer is a matrix-vector product bound by memory reads. On CPU, MKL's GEMV
reads a weight stored [in, out] faster than the usual [out, in] (17 vs 11 GB/s on one machine
here, 28 vs 24 GB/s on another; see docs/engine.md). So on CPU, `prepare()` keeps a transposed
copy and drops the original; CUDA keeps `F.linear`.
"""

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Linear):
    weight_t: torch.Tensor | None = None

    def prepare(self) -> None:
        """Called once after the weights are loaded: on CPU, store the weight [in, out] and keep
        `weight` as a view of that storage, so the matrix is held once."""
        if self.weight.device.type == "cpu":
            self.weight_t = self.weight.detach().t().contiguous()
            self.weight.data = self.weight_t.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_t is None:
            return F.linear(x, self.weight, self.bias)
        if self.bias is None:
            return torch.matmul(x, self.weight_t)
        return torch.addmm(self.bias, x, self.weight_t)
