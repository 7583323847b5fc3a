"""Tensor-parallel layers and the arithmetic of who holds which rows.

Column-parallel linears (fused q/k/v, fused gate/up) need no communication: each rank computes
its own heads / its own slice of the MLP, so they are plain `Linear`s holding a shard (model.py
loads it). A row-parallel linear (o_proj, down_proj) takes its slice of the input features,
and the partial outputs are summed over the stage (one all-reduce each).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workers.engine.layers.linear import Linear
from workers.engine.parallel.group import RankGroup


def head_range(num_heads: int, tp: int, tp_rank: int) -> tuple[int, int]:
    per = num_heads // tp
    return tp_rank * per, (tp_rank + 1) * per


def kv_head_range(num_kv_heads: int, tp: int, tp_rank: int) -> tuple[int, int]:
    """With at least as many KV heads as ranks each rank holds its share; with fewer, each KV
    head is replicated on tp / num_kv_heads consecutive ranks, the ones whose query heads use it."""
    if num_kv_heads >= tp:
        return head_range(num_kv_heads, tp, tp_rank)
    head = tp_rank * num_kv_heads // tp
    return head, head + 1


def vocab_range(vocab_size: int, tp: int, tp_rank: int) -> tuple[int, int, int]:
    """(first id, ids held, rows per rank): the vocabulary padded to a multiple of tp."""
    per = -(-vocab_size // tp)
    start = tp_rank * per
    return start, max(min(per, vocab_size - start), 0), per


class RowParallelLinear(Linear):
    """Holds input features [in/tp); the stage's partial outputs are summed (all-reduce), the
    bias added once after."""

    def __init__(self, in_features: int, out_features: int, group: RankGroup, bias: bool = False):
        super().__init__(in_features, out_features, bias=bias)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.matmul(x, self.weight_t) if self.weight_t is not None else F.linear(x, self.weight)
        out = self.group.all_reduce(out)
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + per) of the embedding; ids held elsewhere give zeros here, and the
    stage's sum (all-reduce) is every token's row."""

    def __init__(self, vocab_size: int, hidden_size: int, group: RankGroup):
        super().__init__()
        self.group = group
        self.start, self.held, per = vocab_range(vocab_size, group.tp, group.tp_rank)
        self.weight = nn.Parameter(torch.empty(per, hidden_size))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.group.tp == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.held)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0.0)
        return self.group.all_reduce(out)


class ParallelLMHead(Linear):
    """Logits of this rank's vocabulary rows; all-gathered over the stage, padding cut off."""

    def __init__(self, vocab_size: int, hidden_size: int, group: RankGroup):
        _, _, per = vocab_range(vocab_size, group.tp, group.tp_rank)
        super().__init__(hidden_size, per, bias=False)
        self.group = group
        self.vocab_size = vocab_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_gather_last_dim(super().forward(x))[..., : self.vocab_size]
