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

from array import array

from workers.engine.sequence import Sequence
from workers.engine.speculative.drafter import Drafter


def ngram_propose(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The guess for one token history; [] when no n-gram of it recurs.

    The search runs over the tokens' bytes (4 per token) with `bytes.rfind`, which is C-fast:
    this runs for every decoding sequence at every step, and a numpy search had cost ~6 % of a
    demo-model step. A match at an offset that is not a multiple of 4 straddles two tokens and
    is skipped."""
    length = len(tokens)
    buf = array("I", tokens).tobytes()
    size = len(buf) // length if length else 4
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        pattern = buf[(length - n) * size :]
        end = (length - 1) * size  # an earlier occurrence starts before length - n
        at = buf.rfind(pattern, 0, end)
        while at > 0 and at % size:
            at = buf.rfind(pattern, 0, at + len(pattern) - 1)  # the next one to the left
        if at >= 0:
            start = at // size + n  # the token after the most recent earlier occurrence
            period = length - start
            return [tokens[start + j % period] for j in range(k)]
    return []


class NgramDrafter(Drafter):
    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int):
        self.k = num_speculative_tokens
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

    def propose(self, seqs: list[Sequence], max_tokens: list[int]) -> list[list[int]]:
        return [
            ngram_propose(seq.token_ids, self.min_n, self.max_n, min(self.k, limit))
            for seq, limit in zip(seqs, max_tokens, strict=True)
        ]
