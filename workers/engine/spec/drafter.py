"""What a drafter is to the engine: before each step, up to k guesses per decoding sequence.

The engine asks `propose` for the sequences that decode this step (when the batch is small
enough for speculation to pay), each with the most tokens it may guess (k, fewer near
`max_tokens` or the end of the context); the target model then checks every guess in the same
forward pass (llm_engine.LLMEngine.step). A guess costs a query token whether or not it is
accepted, so a drafter with nothing good to say proposes nothing.

The EAGLE-3 drafter (not built yet) also reads the target's hidden states at a low, a middle
and a high layer for the tokens accepted so far. It will name those layers, the model runner
will return those layers' hidden states at the positions it computed, and the engine will give
the drafter the rows of the accepted tokens after verification, before the next `propose`;
it keeps them per sequence (and drops them when a sequence finishes or is preempted, as its
own draft KV). Deterministic guesses need no probabilities: a drafter that samples its guesses
would return its q as well (spec/rejection.py takes it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.engine.sequence import Sequence


class Drafter:
    def propose(self, seqs: list[Sequence], max_tokens: list[int]) -> list[list[int]]:
        """For each sequence, at most `max_tokens[i]` (≥ 1) guesses of its next tokens, in
        order; an empty list when it has none."""
        raise NotImplementedError
