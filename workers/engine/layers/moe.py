"""DeepSeek-V3 mixture of experts: sigmoid routing with a correction bias, optionally limited to
the best groups of experts, then routed experts computed batched, plus shared experts.

Routing (`route`) is transformers' DeepseekV3TopkRouter: scores = sigmoid(x · W_gate) in fp32;
the *choice* uses scores + e_score_correction_bias: with n_group > 1 only the topk_group groups
whose two best biased scores sum highest are eligible, then the top num_experts_per_tok experts
are taken; the *weights* are the unbiased scores of those, normalised to sum 1 when
norm_topk_prob, times routed_scaling_factor. Kimi K2 has n_group = 1 (no group limit).

Experts: the (token, expert) pairs are sorted by expert, so each expert runs one matmul over
its contiguous slice of tokens (a loop over the experts hit, never over tokens), and the
weighted outputs are added back to their tokens. Dense experts are stored stacked (`Experts`);
quantized ones as one pair of quantized layers each (`ExpertLinears`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workers.engine import kernels
from workers.engine.config import MoEConfig


def route(logits: torch.Tensor, bias: torch.Tensor, moe: MoEConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [tokens, experts] fp32 → (weights [tokens, k] fp32, expert ids [tokens, k])."""
    scores = logits.sigmoid()
    choice = scores + bias
    if moe.n_group > 1:
        grouped = choice.view(-1, moe.n_group, moe.n_routed_experts // moe.n_group)
        group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
        keep = group_scores.topk(moe.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
        choice = grouped.masked_fill(~group_mask[:, :, None], float("-inf")).view_as(choice)
    ids = choice.topk(moe.num_experts_per_tok, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if moe.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * moe.routed_scaling_factor, ids


class _SortedExperts(nn.Module):
    """The routed computation both expert stores share: (token, expert) pairs sorted by expert,
    one call per expert hit on its contiguous slice, weighted outputs added back to their tokens.

    Under expert parallelism a store holds experts [first_expert, first_expert + num_experts)
    of the layer: it computes only the pairs routed to those and returns its partial sum (the
    ranks' partials are summed by the caller: parallel/deepseek.py)."""

    num_experts: int  # held here
    first_expert: int = 0  # the layer-wide id of the first one held

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        k = ids.shape[1]
        flat = ids.reshape(-1)
        order = flat.argsort(stable=True)
        first, held = self.first_expert, self.num_experts
        counts = torch.bincount(flat, minlength=first + held).tolist()
        lo = sum(counts[:first])
        counts = counts[first : first + held]
        order = order[lo : lo + sum(counts)]  # the pairs routed to the experts held here
        tokens = order // k  # the token of each sorted (token, expert) pair
        xs = x.index_select(0, tokens)
        out = torch.empty_like(xs)
        start = 0
        for e, n in enumerate(counts):
            if n:
                out[start : start + n] = self.expert(e, xs[start : start + n])
                start += n
        out.mul_(weights.reshape(-1).index_select(0, order)[:, None].to(out.dtype))
        return torch.zeros_like(x).index_add_(0, tokens, out)


class Experts(_SortedExperts):
    """`n` dense SwiGLU experts stored stacked: gate_up [n, 2·inter, hidden], down [n, hidden, inter]."""

    def __init__(self, n: int, hidden: int, inter: int, first_expert: int = 0):
        super().__init__()
        self.num_experts, self.inter, self.first_expert = n, inter, first_expert
        self.gate_up = nn.Parameter(torch.empty(n, 2 * inter, hidden))
        self.down = nn.Parameter(torch.empty(n, hidden, inter))

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return kernels.silu_and_mul(x @ self.gate_up[e].t()) @ self.down[e].t()


class ExpertLinears(_SortedExperts):
    """`n` SwiGLU experts as a pair of linear layers each (gate and up fused, down), made by
    `make(prefixes, in_features, out_features)`: the form quantized experts take, since a
    quantized layer is 2-D and keeps its checkpoint's own tensors (layers/quantized.py)."""

    def __init__(self, n: int, hidden: int, inter: int, prefix: str, make, first_expert: int = 0):
        super().__init__()
        self.num_experts, self.inter, self.first_expert = n, inter, first_expert
        held = range(first_expert, first_expert + n)  # checkpoint names carry layer-wide ids
        self.gate_up = nn.ModuleList(
            make((f"{prefix}.{e}.gate_proj", f"{prefix}.{e}.up_proj"), hidden, (inter, inter)) for e in held
        )
        self.down = nn.ModuleList(make(f"{prefix}.{e}.down_proj", inter, hidden) for e in held)

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return self.down[e](kernels.silu_and_mul(self.gate_up[e](x)))


class MoE(nn.Module):
    def __init__(self, hidden: int, moe: MoEConfig, shared: nn.Module | None, experts: nn.Module | None = None):
        super().__init__()
        self.config = moe
        self.gate_weight = nn.Parameter(torch.empty(moe.n_routed_experts, hidden))
        # transformers keeps the correction bias in fp32 whatever the model's dtype.
        self.register_buffer("e_score_correction_bias", torch.zeros(moe.n_routed_experts, dtype=torch.float32))
        self.experts = (
            experts if experts is not None else Experts(moe.n_routed_experts, hidden, moe.moe_intermediate_size)
        )
        self.shared_experts = shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x.float(), self.gate_weight.float())
        weights, ids = route(logits, self.e_score_correction_bias, self.config)
        out = self.experts(x, weights, ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out
