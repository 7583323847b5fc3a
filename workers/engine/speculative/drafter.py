"""What a drafter is to the engine: before each step, up to k guesses per decoding sequence.

The engine asks `propose` for the sequences that decode this step (when the batch is small
enough for speculation to pay), each with the most tokens it may guess (k, fewer near
`max_tokens` or the end of the context); the target model then checks every guess in the same
forward pass (llm_engine.LLMEngine.step). A guess costs a query token whether or not it is
accepted, so a drafter with nothing good to say proposes nothing.

A drafter that reads the target's hidden states (EAGLE-3, speculative/eagle3.py) names the target
layers in `aux_layer_ids`; the model runner then returns those layers' outputs for every token
it computes, and after the step the engine hands each sequence the rows it kept (`observe`:
prefill chunks, a decode's token, a verify's last token and accepted drafts), all of the
batch's at once, so a drafter can run them as one batch. Deterministic
guesses need no probabilities: a drafter that samples its guesses would return its q as well
(speculative/rejection.py takes it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from workers.engine.sequence import Sequence


class Drafter:
    # Target layers whose hidden states this drafter reads (None: it reads none).
    aux_layer_ids: tuple[int, ...] | None = None

    def propose(self, seqs: list[Sequence], max_tokens: list[int]) -> list[list[int]]:
        """For each sequence, at most `max_tokens[i]` (≥ 1) guesses of its next tokens, in
        order; an empty list when it has none."""
        raise NotImplementedError

    def observe(self, entries: list[tuple[Sequence, int, torch.Tensor]]) -> None:
        """For each (seq, start, states): the target's aux-layer states [n, ...] at positions
        start..start+n-1 of `seq`, whose K/V the step kept (called only when `aux_layer_ids`
        is set, once a step for the whole batch)."""

    def release(self, seq: Sequence) -> None:
        """`seq` finished or was aborted: drop what is kept for it."""
