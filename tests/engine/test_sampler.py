import math

import pytest
import torch

from workers.engine.errors import RequestError
from workers.engine.sampler import Sampler, apply_penalties, top_k_top_p_min_p
from workers.engine.sampling_params import SamplingParams
from workers.engine.sequence import Sequence


def seqs(n, **params):
    return [Sequence(str(i), [1, 2, 3], SamplingParams(**params)) for i in range(n)]


def test_greedy_is_argmax():
    logits = torch.tensor([[0.1, 3.0, 0.2], [5.0, 0.0, 0.0]])
    assert Sampler()(logits, seqs(2, temperature=0)).token_ids == [1, 0]


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch():
    logits = torch.randn(1, 50)
    draws_a = [Sampler(seed=1)(logits, seqs(1, temperature=1.0, seed=7)).token_ids[0] for _ in range(1)]
    batch = Sampler(seed=99)(
        torch.cat([torch.randn(1, 50), logits]), [seqs(1, temperature=1.0)[0], seqs(1, temperature=1.0, seed=7)[0]]
    )
    assert batch.token_ids[1] == draws_a[0]
    s = seqs(1, temperature=1.0, seed=5)[0]
    t = seqs(1, temperature=1.0, seed=5)[0]
    sampler = Sampler()
    assert [sampler(logits, [s]).token_ids[0] for _ in range(10)] == [
        sampler(logits, [t]).token_ids[0] for _ in range(10)
    ]


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.7, 0.2, 0.1])
    logits = probs.log().expand(4000, 3).contiguous()
    toks = torch.tensor(Sampler(seed=0)(logits, seqs(4000, temperature=1.0)).token_ids)
    freq = torch.bincount(toks, minlength=3).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03)


def test_top_k_keeps_the_k_largest():
    out = top_k_top_p_min_p(torch.tensor([1.0, 4.0, 3.0, 2.0]), top_k=2, top_p=1.0, min_p=0.0)
    assert torch.isinf(out[[0, 3]]).all() and torch.isfinite(out[[1, 2]]).all()


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    out = top_k_top_p_min_p(logits, top_k=-1, top_p=0.75, min_p=0.0)
    assert torch.isfinite(out[:2]).all() and torch.isinf(out[2:]).all()
    out = top_k_top_p_min_p(logits, top_k=-1, top_p=0.01, min_p=0.0)
    assert torch.isfinite(out).sum() == 1 and torch.isfinite(out[0])


def test_min_p_drops_tokens_below_fraction_of_the_best():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    out = top_k_top_p_min_p(logits, top_k=-1, top_p=1.0, min_p=0.5)
    assert torch.isfinite(out[:2]).all() and torch.isinf(out[2:]).all()


def test_penalties():
    logits = torch.tensor([2.0, -2.0, 1.0, 1.0])
    apply_penalties(
        logits,
        [0, 1, 2, 2],
        num_prompt=2,
        p=SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25),
    )
    # token 0 (prompt): 2/2; token 1 (prompt): -2*2; token 2 (output twice): 1/2 - 2*0.5 - 0.25
    assert logits.tolist() == [1.0, -4.0, 0.5 - 1.0 - 0.25, 1.0]


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -1}, {"top_p": 0}, {"top_k": -5}, {"max_tokens": 0}, {"logprobs": 50}, {"presence_penalty": 3}],
)
def test_invalid_params_raise_clear_errors(kwargs):
    with pytest.raises(RequestError, match=next(iter(kwargs))):
        SamplingParams(**kwargs)


def test_logprobs_are_the_models():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    res = Sampler()(logits, seqs(1, temperature=0, logprobs=2))
    expected = torch.log_softmax(logits[0], -1)
    assert res.token_ids == [2]
    assert math.isclose(res.logprobs[0][2], expected[2].item(), abs_tol=1e-6)
    assert set(res.logprobs[0]) == {2, 1}
