"""The machine-independent counts behind `bench spec`'s bounds (workers/bench/work_count.py):
ops that run a kernel, weight bytes of linear layers, and the prompt-lookup oracle."""

from __future__ import annotations

import torch
from torch import nn

from workers.bench.spec import _lookup_oracle
from workers.bench.work_count import OpCounter, counting, linear_bytes


@torch.inference_mode()  # as the engine runs: matmul and rms_norm arrive whole
def test_views_and_no_ops_are_not_counted_kernels_are():
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    with OpCounter() as views:
        x.view(2, 16).t()
        x[1:].unsqueeze(0).transpose(0, 1)
        x.to(torch.float32)  # already float32: returns x itself
    assert views.ops == 0
    with OpCounter() as kernels:
        y = x @ w
        y = y + 1
        torch.rms_norm(x, (8,))
        x.to(torch.float64)  # a real conversion
        x.t().reshape(-1)  # a reshape that has to copy
    assert kernels.ops == 5 and y.shape == (4, 3)
    with OpCounter() as views:
        x.reshape(2, 16)  # one that does not
    assert views.ops == 0


class Adder:
    def add(self, a, b):
        return a + b + b


def test_counting_wraps_a_method_and_restores_it():
    adder = Adder()
    counts: list[int] = []
    with counting(adder, "add", counts):
        assert torch.equal(adder.add(torch.ones(2), torch.ones(2)), torch.full((2,), 3.0))
        adder.add(torch.ones(2), torch.ones(2))
    assert counts == [2, 2]
    assert "add" not in vars(adder)  # the class's method again
    adder.add = lambda a, b: a  # a wrapper already on the instance (the bench's timers) stays
    with counting(adder, "add", counts):
        adder.add(torch.ones(1), torch.ones(1))
    assert counts == [2, 2, 0] and adder.add(1, 2) == 1


def test_linear_bytes_counts_each_weight_once():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 6, bias=False), nn.Linear(6, 10, bias=False))
    assert linear_bytes(model) == (4 * 6 + 6 * 10) * 4
    model[2].weight = nn.Parameter(torch.randn(10, 6))
    tied = nn.Linear(6, 10, bias=False)
    tied.weight = model[2].weight
    assert linear_bytes(model, tied) == (4 * 6 + 6 * 10) * 4
    assert linear_bytes(model.half()) == (4 * 6 + 6 * 10) * 2


def test_lookup_oracle_counts_tokens_some_earlier_ngram_predicts():
    # After the answer's first token: 2 follows (5, 1), seen nowhere before; 7 follows (1, 2) as
    # in the prompt; 9 follows (2, 7), which the prompt continued with 5.
    assert _lookup_oracle([[1, 2, 7, 5]], [[1, 2, 7, 9]]) == (1, 3)
    assert _lookup_oracle([[1, 2, 3]], [[4, 5, 6]]) == (0, 2)
    # One token of context is not enough: n starts at 2.
    assert _lookup_oracle([[5, 8]], [[5, 8]]) == (0, 1)
