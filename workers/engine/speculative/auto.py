"""Speculative method `auto`: prompt lookup where the context repeats, the EAGLE-3 head (when
the deployment has one) where it does not, and none where neither pays.

Per sequence and step: when the sequence's last tokens recur earlier in its context (a follow-up
turn quoting an earlier tool call, an edit quoting the code, a summary quoting the document; with
a head, a match of at least MIN_MATCH_WITH_HEAD tokens), prompt lookup's guess is taken, since
copied text is accepted whole and costs no draft pass; otherwise the head drafts (one batched
pass for all of those sequences). Whether any guess is worth verifying, and how many, is the
measured cost model's choice (`choose_k` is always "measured" for `auto`: cost_model.py), so on a
machine where verifying does not pay, nothing is drafted. The head is fed every step, whichever
drafter guessed, so it can take over at once (not at a batch size where nothing has paid for a
while: speculator.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.engine.speculative.drafter import Drafter
from workers.engine.speculative.ngram import NgramDrafter, ngram_propose

if TYPE_CHECKING:
    import torch

    from workers.engine.sequence import Sequence


# With a head, prompt lookup takes over only on a match of at least this many tokens: JSON and
# chat repeat short pieces (`": "`, `, "`) whose continuations differ, and on the bench's tool
# calls every 2-token lookup guess was rejected where the head's were accepted at ~0.9.
MIN_MATCH_WITH_HEAD = 3


class AutoDrafter(Drafter):
    def __init__(self, ngram: NgramDrafter, head: Drafter | None):
        self.ngram = ngram
        self.head = head
        self.aux_layer_ids = head.aux_layer_ids if head is not None else None
        self.min_n = max(ngram.min_n, MIN_MATCH_WITH_HEAD) if head is not None else ngram.min_n

    def propose(self, seqs: list[Sequence], max_tokens: list[int]) -> list[list[int]]:
        ngram = self.ngram
        drafts = [
            ngram_propose(seq.token_ids, self.min_n, max(ngram.max_n, self.min_n), min(ngram.k, limit))
            for seq, limit in zip(seqs, max_tokens, strict=True)
        ]
        rest = [i for i, draft in enumerate(drafts) if not draft]
        if self.head is not None and rest:
            guesses = self.head.propose([seqs[i] for i in rest], [max_tokens[i] for i in rest])
            for i, guess in zip(rest, guesses, strict=True):
                drafts[i] = guess
        return drafts

    def observe(self, entries: list[tuple[Sequence, int, torch.Tensor]]) -> None:
        if self.head is not None:
            self.head.observe(entries)

    def release(self, seq: Sequence) -> None:
        if self.head is not None:
            self.head.release(seq)
