"""The rejection sampler is lossless: what it emits is distributed exactly as the target's
own samples, whatever the draft distribution (a deliberately bad one here) or a one-hot draft
(n-gram). Many seeded draws on a small vocabulary; a chi-square test of the counts."""

import torch

from workers.engine.speculative.rejection import rejection_sample

VOCAB = 6
DRAWS = 20_000
# Chi-square critical value, 5 degrees of freedom, p = 1e-4: a correct sampler fails this
# once in 10,000 seeds; a wrong residual exceeds it by orders of magnitude (hundreds here).
CRITICAL = 25.7


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "drew a token the target gives probability 0"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def target() -> torch.Tensor:
    """p_0, p_1, p_2: the target's distributions at three positions (one with a zero)."""
    return torch.tensor(
        [
            [0.40, 0.25, 0.15, 0.10, 0.07, 0.03],
            [0.05, 0.05, 0.10, 0.20, 0.30, 0.30],
            [0.30, 0.00, 0.30, 0.10, 0.10, 0.20],
        ]
    )


def bad_draft() -> torch.Tensor:
    """q_0, q_1: far from p (mass where p has little, and on p's zero)."""
    return torch.tensor(
        [
            [0.02, 0.03, 0.05, 0.10, 0.30, 0.50],
            [0.60, 0.20, 0.10, 0.05, 0.03, 0.02],
        ]
    )


def run(draft_probs: torch.Tensor | None, fixed_draft: list[int] | None, seed: int = 0):
    """Counts of the first emitted token, and of the second when the first draft was accepted,
    plus the number of first drafts accepted."""
    p = target()
    gen = torch.Generator().manual_seed(seed)
    first = torch.zeros(VOCAB)
    second = torch.zeros(VOCAB)
    accepted = 0
    for _ in range(DRAWS):
        if draft_probs is not None:  # drafts are samples of q, as a drafter would make them
            draft = [int(torch.multinomial(draft_probs[j], 1, generator=gen)) for j in range(2)]
        else:
            draft = fixed_draft
        out = rejection_sample(lambda j: p[j], draft, draft_probs, lambda j: gen)
        assert 1 <= len(out) <= 3
        first[out[0]] += 1
        if len(out) > 1:  # the first draft was accepted: the next token is p_1's
            assert out[0] == draft[0]
            accepted += 1
            second[out[1]] += 1
    return first, second, accepted


def test_bad_draft_distribution_still_yields_the_target_distribution():
    first, second, accepted = run(bad_draft(), None)
    p = target()
    assert chi_square(first, p[0]) < CRITICAL
    assert chi_square(second, p[1]) < CRITICAL
    # Accepted with probability sum_x min(p(x), q(x)) (Leviathan et al., eq. 1).
    expected = float(torch.minimum(p[0], bad_draft()[0]).sum())
    assert abs(accepted / DRAWS - expected) < 0.01


def test_one_hot_draft_yields_the_target_distribution():
    # n-gram's guesses: q is one-hot, accepted with probability p(guess).
    first, second, accepted = run(None, [5, 4])
    p = target()
    assert chi_square(first, p[0]) < CRITICAL
    assert chi_square(second, p[1]) < CRITICAL
    assert abs(accepted / DRAWS - float(p[0, 5])) < 0.01


def test_draft_the_target_never_samples_is_always_rejected():
    p = target()
    gen = torch.Generator().manual_seed(1)
    q = torch.zeros(2, VOCAB)
    q[:, 1] = 1.0
    for _ in range(200):
        out = rejection_sample(lambda j: p[2], [1, 1], q, lambda j: gen)
        assert len(out) == 1 and out[0] != 1


def test_draft_equal_to_the_target_is_always_accepted():
    p = target()
    gen = torch.Generator().manual_seed(2)
    for _ in range(200):
        draft = [int(torch.multinomial(p[j], 1, generator=gen)) for j in range(2)]
        assert rejection_sample(lambda j: p[j], draft, p[:2], lambda j: gen)[:2] == draft


def test_same_generator_seeds_give_the_same_tokens():
    p = target()

    def once():
        gens = [torch.Generator().manual_seed(100 + j) for j in range(3)]
        return [rejection_sample(lambda j: p[j], [0, 4], bad_draft(), lambda j: gens[j]) for _ in range(50)]

    assert once() == once()
