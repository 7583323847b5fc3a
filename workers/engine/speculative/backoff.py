"""Per-sequence backoff: a sequence whose drafts keep being rejected stops drafting for a while.

A verify step costs more than a decode step (1.3x at batch 1 on the 2-core CPU, more at larger
batches: docs/engine.md), so a draft run that accepts nothing is pure cost. Text that repeats
nothing (prompt lookup on an answer that copies no earlier text) rejects run after run. After
`after` consecutive runs that accepted nothing, a sequence skips drafting for 1, 2, 4, ... and at
most `MAX_PAUSE` steps that speculate (a step above the batch threshold drafts nothing anyway, and
does not count), then tries again; a run that accepts a token resets it. Drafts change
only how fast tokens come, never which, so this cannot change an output.

The state lives on the sequence (`draft_misses`, `draft_pause`), so it follows it through
preemption and is gone with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.engine.sequence import Sequence

MAX_PAUSE = 16


class DraftBackoff:
    def __init__(self, after: int):
        """`after`: consecutive draft runs accepting nothing before a pause (0: never pause)."""
        self.after = after

    def allows(self, seq: Sequence) -> bool:
        """Whether `seq` drafts this step; a paused sequence counts one step of its pause off."""
        if seq.draft_pause:
            seq.draft_pause -= 1
            return False
        return True

    def record(self, seq: Sequence, accepted: int) -> None:
        """A draft run of `seq` was verified and `accepted` of its guesses taken."""
        if accepted or not self.after:
            seq.draft_misses = 0
            return
        seq.draft_misses += 1
        if seq.draft_misses >= self.after:
            seq.draft_pause = min(MAX_PAUSE, 2 ** (seq.draft_misses - self.after))
