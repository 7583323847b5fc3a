"""Continuous batching: every step picks which sequences run and how many tokens each computes.

Policy, per step, under a token budget (`max_num_batched_tokens`):
1. Running sequences first, most urgent priority first and oldest first within one: a decoding
   sequence computes one token; one still prefilling (a long prompt, or a preempted sequence
   recomputing) computes the next chunk. When the KV cache cannot grow, the least urgent running
   sequence (the youngest among equals) is preempted: its blocks are freed and it goes back to
   the queue to be recomputed later.
   Speculative drafts then extend decoding sequences with the budget and blocks left (a draft
   never causes a preemption).
2. Then waiting sequences join while the budget, the sequence limit and free blocks allow: by
   priority (lower first, vLLM's `priority`), then, with fair sharing, the tenant that got the
   least service so far (fair_share.py), then in queue order. A waiting sequence that finds no
   room preempts running sequences of a less urgent priority, never of its own. A step that
   computes a prompt leaves out the sequences less urgent than it (they go on at the next step),
   so a batch does not lengthen an interactive request's first token. Each reuses its
   cached prefix and prefills in chunks. With KV tiers, a sequence whose prefix continues in a
   tier is admitted once that load is done (the ones behind it go first meanwhile), with the
   loaded blocks as part of its prefix. A forked sample (parallel_sampling.py) waits at the front
   of its tenant's queue with its shared prompt blocks and only needs room for the rest.

Priorities and fair sharing change which request runs when, never what it computes: a preempted
sequence is recomputed to the same state.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workers.engine.block_manager import BlockManager
from workers.engine.fair_share import FairShare
from workers.engine.no_tiers import NoTiers
from workers.engine.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from workers.engine.tiered_cache import TieredCache


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_tokens: int  # query tokens this step, from seq.num_computed_tokens (drafts included)
    # Speculative guesses verified this step: they follow the sequence's last token as query
    # tokens, and logits are taken at every one of those positions.
    draft_token_ids: list[int] = field(default_factory=list)

    @property
    def samples(self) -> bool:
        """This chunk reaches the sequence's last token, so its logits give the next one."""
        return self.seq.num_computed_tokens + self.num_tokens - len(self.draft_token_ids) == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    prefills: list[ScheduledSeq]  # chunks of more than one token (a decode with drafts too)
    decodes: list[ScheduledSeq]  # one token each
    preempted: list[Sequence]

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes

    @property
    def all(self) -> list[ScheduledSeq]:
        return self.prefills + self.decodes


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        tiers: TieredCache | NoTiers | None = None,
        fair_share: bool = True,
    ):
        """`fair_share`: admit by tenant (fair_share.py) within a priority; else first come, first served."""
        self.block_manager = block_manager
        self.tiers = tiers if tiers is not None else NoTiers()
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.fair = FairShare(fair_share)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.fair.arrive(seq)
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence, free_blocks: bool = True) -> None:
        """Drop a finished or aborted sequence and release its blocks (unless the caller keeps
        them, as a prefill replica does until they are sent)."""
        if seq.status is not SequenceStatus.FINISHED:
            self.fair.leave(seq)
        seq.status = SequenceStatus.FINISHED
        if seq in self.running:
            self.running.remove(seq)
        else:
            with contextlib.suppress(ValueError):
                self.waiting.remove(seq)
            self.tiers.admitted(seq)
        if free_blocks:
            self.block_manager.free(seq)

    def add_forked(self, seqs: list[Sequence]) -> None:
        """Forked samples (parallel_sampling.py) go first in the queue, in index order."""
        for seq in reversed(seqs):
            seq.status = SequenceStatus.WAITING
            self.fair.arrive(seq)
            self.waiting.appendleft(seq)

    def add_running(self, seq: Sequence) -> None:
        """Admit a sequence whose prompt K/V is already in its blocks (computed elsewhere)."""
        seq.status = SequenceStatus.RUNNING
        seq.scheduled_at = time.monotonic()
        self.fair.arrive(seq)
        self.running.append(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self, drafts: dict[Sequence, list[int]] | None = None) -> SchedulerOutput:
        """`drafts`: speculative guesses for decoding sequences, verified this step when the
        budget and free blocks allow (trimmed otherwise). They are placed after every running
        sequence has its one token, so a guess never preempts a sequence."""
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted: list[Sequence] = []
        bm = self.block_manager
        self.running.sort(key=_priority)  # stable: arrival order within a priority
        for seq in self.running:
            self.fair.charge_output(seq)

        for seq in list(self.running):
            if seq not in self.running:  # preempted earlier in this loop
                continue
            if budget <= 0:
                break
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not bm.ensure_slots(seq, n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                scheduled.append(ScheduledSeq(seq, n))
                budget -= n

        if drafts:
            budget = self._add_drafts(scheduled, drafts, budget)

        pressed = bool(preempted)  # the running ones did not fit: admit nobody
        for seq in self._admission_order():
            if budget <= 0:  # a less urgent sequence's chunk may have taken it: it waits a step
                budget += self._reclaim_budget(seq, scheduled)
            if budget <= 0 or pressed:
                break
            forked = bool(seq.block_table)  # a forked sample: its prompt blocks are shared already
            if not (forked or self.tiers.ready(seq, bm)):
                continue  # its blocks are loading from a tier
            cached = self._allocate(seq, forked, budget)
            while cached is None:  # no room: make some from less urgent priorities, if any run
                freed = self._preempt_for(seq, scheduled, preempted)
                if freed is None:
                    break
                budget += freed
                cached = self._allocate(seq, forked, budget)
            if cached is None:
                break
            self.waiting.remove(seq)
            if not forked:
                self.tiers.admitted(seq)
            if seq.num_preemptions == 0 and not forked:  # its first admission (a resumed one may have output)
                seq.num_cached_tokens = min(cached, seq.num_prompt_tokens)
                if seq.index == 0:  # forked samples share the prompt: it is charged once
                    self.fair.charge_prompt(seq)
            if seq.scheduled_at is None:
                seq.scheduled_at = time.monotonic()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            scheduled.append(ScheduledSeq(seq, n))
            budget -= n

        scheduled = _yield_to_urgent_prompts(scheduled)
        prefills = [s for s in scheduled if s.num_tokens > 1]
        decodes = [s for s in scheduled if s.num_tokens == 1]
        return SchedulerOutput(prefills, decodes, preempted)

    def _allocate(self, seq: Sequence, forked: bool, budget: int) -> int | None:
        """Room for `seq`'s next chunk, within the sequence limit: the tokens its caches cover,
        or None (nothing changed)."""
        if len(self.running) >= self.max_num_seqs:
            return None
        bm = self.block_manager
        if forked:
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            return seq.num_computed_tokens if bm.ensure_slots(seq, n) else None
        return bm.allocate(seq, budget, self.tiers.loaded_blocks(seq), self.tiers.write_block)

    def _admission_order(self) -> Iterator[Sequence]:
        """The waiting sequences in the order they may join: by priority, then (fair sharing)
        the tenant with the smallest counter, each tenant's own in queue order. A generator, so
        each pick reads the counters as the admissions before it charged them."""
        fair = self.fair.enabled
        groups: dict[tuple[int, str], deque[Sequence]] = {}
        for seq in self.waiting:
            groups.setdefault((seq.share.priority, seq.share.tenant if fair else ""), deque()).append(seq)
        while groups:
            # Ties keep the order in which the groups first appear in the queue.
            key = min(groups, key=lambda k: (k[0], self.fair.counter(k[1]))) if len(groups) > 1 else next(iter(groups))
            queue = groups[key]
            yield queue.popleft()
            if not queue:
                del groups[key]

    def _reclaim_budget(self, seq: Sequence, scheduled: list[ScheduledSeq]) -> int:
        """The budget scheduled chunks of sequences less urgent than the waiting `seq` took
        (they keep their blocks and go on at the next step); 0 if there are none."""
        urgent = seq.share.priority
        taken = [item for item in scheduled if item.seq.share.priority > urgent]
        for item in taken:
            scheduled.remove(item)
        return sum(item.num_tokens for item in taken)

    def _preempt_for(self, seq: Sequence, scheduled: list[ScheduledSeq], preempted: list[Sequence]) -> int | None:
        """Preempt the least urgent running sequence (the youngest among equals) if it is less
        urgent than the waiting `seq`; returns the budget it held this step, or None if no
        running sequence is less urgent."""
        victims = [s for s in reversed(self.running) if s.share.priority > seq.share.priority]
        if not victims:
            return None
        victim = max(victims, key=_priority)  # the first of the largest: the youngest
        item = next((item for item in scheduled if item.seq is victim), None)
        if item is not None:
            scheduled.remove(item)
        self._preempt(victim)
        preempted.append(victim)
        return item.num_tokens if item is not None else 0

    def _add_drafts(self, scheduled: list[ScheduledSeq], drafts: dict[Sequence, list[int]], budget: int) -> int:
        bm = self.block_manager
        for item in scheduled:
            draft = drafts.get(item.seq)
            if not draft or budget <= 0 or item.num_tokens != 1 or not item.samples:
                continue
            seq = item.seq
            # As many guesses as the budget and the blocks it has or can get will hold.
            room = (len(seq.block_table) + bm.num_free_blocks) * bm.block_size - seq.num_computed_tokens - 1
            draft = draft[: min(budget, room)]
            if draft and bm.ensure_slots(seq, 1 + len(draft)):
                item.num_tokens += len(draft)
                item.draft_token_ids = list(draft)
                budget -= len(draft)
        return budget


def _priority(seq: Sequence) -> int:
    return seq.share.priority


def _yield_to_urgent_prompts(scheduled: list[ScheduledSeq]) -> list[ScheduledSeq]:
    """A step that computes a prompt (a chunk of more than its last token) computes it without
    the sequences of less urgent priorities: they keep their blocks and go on at the next step.
    A step's time grows with every sequence in it, so a batch running beside an interactive
    request would otherwise lengthen the step that produces its first token."""
    prompts = [item.seq.share.priority for item in scheduled if item.num_tokens - len(item.draft_token_ids) > 1]
    if not prompts:
        return scheduled
    urgent = min(prompts)
    return [item for item in scheduled if item.seq.share.priority <= urgent]
