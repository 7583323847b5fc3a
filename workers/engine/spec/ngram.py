"""Prompt lookup: guess that the text repeats itself.

For n from `prompt_lookup_max` down to `prompt_lookup_min`, take the last n tokens of the
sequence (prompt and output) and find their most recent earlier occurrence; propose the tokens
that followed it. The longest n that matches wins: a longer match is better evidence.

A continuation that runs into the end of the sequence is continued periodically: the match
says the text repeats with period `len - n - start`, so its guess for the token after the end
is the one a period earlier (this is what lets `a b c a b` propose `c a b c` and so on, where a
strict copy would stop after `c a b`).
"""

from __future__ import annotations

import numpy as np

from workers.engine.sequence import Sequence
from workers.engine.spec.drafter import Drafter


def ngram_propose(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """The guess for one token history (1-D int array); [] when no n-gram recurs."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        # match[i]: tokens[i : i + n] equals the last n tokens, for every start i < length - n.
        match = tokens[: length - n] == tokens[length - n]
        for j in range(1, n):
            match &= tokens[j : length - n + j] == tokens[length - n + j]
        hits = np.flatnonzero(match)
        if hits.size:
            start = int(hits[-1]) + n  # the token after the most recent earlier occurrence
            period = length - start
            return [int(tokens[start + j % period]) for j in range(k)]
    return []


class NgramDrafter(Drafter):
    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int):
        self.k = num_speculative_tokens
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

    def propose(self, seqs: list[Sequence], max_tokens: list[int]) -> list[list[int]]:
        return [
            ngram_propose(np.asarray(seq.token_ids, dtype=np.int64), self.min_n, self.max_n, min(self.k, limit))
            for seq, limit in zip(seqs, max_tokens, strict=True)
        ]
