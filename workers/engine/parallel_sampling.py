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
from collections.abc import Iterable

from workers.engine.block_manager import BlockManager
from workers.engine.errors import RequestError
from workers.engine.sequence import Sequence


def check_n(params, hold_blocks: bool, output_token_ids) -> None:
    """RequestError naming `n` where forking is not built: a prefill held for another replica
    (it computes sample 0 only; the decode replica forks) and a resumed request."""
    if params.n > 1 and (hold_blocks or output_token_ids):
        what = "a prefill handed to another replica" if hold_blocks else "resuming a request"
        raise RequestError(f"n > 1 is not built yet for {what}", "n")


def due_forks(seqs: Iterable[Sequence]) -> list[Sequence]:
    """The sequences among `seqs` whose other samples are to be forked now: sample 0 of a
    request of n > 1, its prompt computed, no output yet."""
    return [s for s in seqs if s.params.n > len(s.samples) and s.num_output_tokens == 0]


def request_finished(seq: Sequence) -> bool:
    """Every sample of `seq`'s request has been made and has finished."""
    return len(seq.samples) == seq.samples[0].params.n and all(sample.is_finished for sample in seq.samples)


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
        child.samples = parent.samples
        child.arrival_time = parent.arrival_time
        child.session_turn = parent.session_turn
        child.share = parent.share
        child.num_cached_tokens = parent.num_cached_tokens
        block_manager.share_prefix(parent, child, shared)
        children.append(child)
    parent.samples.extend(children)
    return children
