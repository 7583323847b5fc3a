"""Verification by rejection sampling (Leviathan et al. 2023, Chen et al. 2023): the tokens a
step emits are distributed exactly as the target model would have sampled them one by one.

At each draft position j, with the target's distribution p_j (after the request's penalties,
temperature and filters, for the output as it would stand after the drafts before j) and the
draft's q_j: accept the draft x with probability min(1, p_j(x) / q_j(x)); on rejection emit a
sample of normalize(max(p_j − q_j, 0)) and stop. When every draft is accepted, emit a sample of
p_k as well, so a step emits 1 to k+1 tokens.

A drafter that guesses deterministically (n-gram; EAGLE drafting greedily) has q one-hot on
its guess: accept with probability p(x), otherwise sample p with x removed. That is the same as
drawing y ~ p_j and accepting iff y == x, emitting y either way, which is how it is done here:
y is drawn with the sampler's own noise for that output position, so a seeded request emits
exactly the tokens it emits without speculation, and greedy (p one-hot on the argmax) accepts
exactly while the argmax equals the draft.

Every draw at position j uses `generator(j)`; the sampler seeds it from (seed, output position)
for seeded requests.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from `probs` (1-D, any non-negative weights) by an exponential race:
    argmax(p / E) with E ~ Exp(1) is a draw from p. The sampler draws the same way."""
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return int((probs / noise).argmax())


def rejection_sample(
    target_probs: Callable[[int], torch.Tensor],
    draft_token_ids: list[int],
    draft_probs: torch.Tensor | None,
    generator: Callable[[int], torch.Generator],
) -> list[int]:
    """The tokens to emit for one sequence: the accepted drafts, then one from the target.

    target_probs(j): p_j, for j in 0..k (computed only for the positions reached).
    draft_probs: [k, vocab] q, or None for one-hot drafts.
    generator(j): the generator for position j's draws.
    """
    emitted: list[int] = []
    for j, draft in enumerate(draft_token_ids):
        p = target_probs(j)
        gen = generator(j)
        if draft_probs is None:
            token = draw(p, gen)
            emitted.append(token)
            if token != draft:
                return emitted
            continue
        q = draft_probs[j]
        # Accept when u < p(x)/q(x), written without the division (q(x) may be tiny).
        u = float(torch.rand((), generator=gen))
        if u * float(q[draft]) < float(p[draft]):
            emitted.append(draft)
            continue
        residual = (p - q).clamp_(min=0)
        if float(residual.sum()) <= 0:  # p == q up to rounding: rejection had probability 0
            residual = p
        emitted.append(draw(residual, gen))
        return emitted
    k = len(draft_token_ids)
    emitted.append(draw(target_probs(k), generator(k)))
    return emitted
