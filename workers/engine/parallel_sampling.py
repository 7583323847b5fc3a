"""`n` samples of one prompt (OpenAI's `n`): the prompt is prefilled once, then forked.

A request with `n` > 1 enters the engine as one sequence, sample 0. When its prompt is computed
and it samples its first token, `fork` makes samples 1..n-1: each starts with the prompt's
tokens and a block table that references sample 0's leading full prompt blocks (their ref
counts go up, BlockManager.share_prefix), exactly the blocks the prefix cache could serve, all
but the one holding the prompt's last token. A sample computes that last (partial) block itself,
into a fresh block of its own, and samples its first token from its own logits; from there it is
an ordinary sequence: it decodes in the batch, can be preempted (its references are dropped and
it is recomputed like any preempted sequence) and finishes on its own.

Seeds: with `seed` set, sample i draws with seed + i, so a seeded request reproduces every
sample and the samples differ. Without one, they draw from the engine's generator.
"""

from __future__ import annotations

import dataclasses

from workers.engine.block_manager import BlockManager
from workers.engine.sequence import Sequence


def sample_params(params, index: int):
    """Sample `index`'s parameters: one sample each, seed + index when seeded."""
    seed = params.seed + index if params.seed is not None else None
    return dataclasses.replace(params, n=1, seed=seed)


def fork(parent: Sequence, block_manager: BlockManager) -> list[Sequence]:
    """Samples 1..n-1 of `parent` (sample 0, whose prompt is computed and which has produced
    no output yet), sharing its leading full prompt blocks."""
    assert parent.num_output_tokens == 0 and parent.num_computed_tokens >= parent.num_prompt_tokens
    n = parent.params.n
    shared = (parent.num_prompt_tokens - 1) // block_manager.block_size
    prompt = parent.token_ids[: parent.num_prompt_tokens]
    children = []
    for index in range(1, n):
        child = Sequence(parent.request_id, prompt, sample_params(parent.params, index), parent.eos_token_ids)
        child.eos_token_ids = parent.eos_token_ids
        child.index = index
        child.group = parent.group
        child.arrival_time = parent.arrival_time
        child.session_turn = parent.session_turn
        child.num_cached_tokens = parent.num_cached_tokens
        block_manager.share_prefix(parent, child, shared)
        children.append(child)
    parent.group.extend(children)
    return children
