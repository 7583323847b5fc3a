"""Speculation's part of the engine loop, behind one object: `Speculator` when it is on,
`NoSpeculation` (does nothing) when it is off, so `LLMEngine.step()` has no speculation branches.

Per step the engine asks it for drafts (`propose`: which sequences draft, how many guesses each
may take, each constrained sequence's draft cut to what its grammar accepts), whether the model
must keep the hidden states a head reads (`keeps_states`), and after sampling it reports each
verified run (`record`: counters and the per-sequence backoff) and hands the step's states to a
hidden-state drafter (`observe`). `release` forgets a finished sequence.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from workers.engine.sequence import Sequence
from workers.engine.speculative import cost_model
from workers.engine.speculative.backoff import DraftBackoff
from workers.engine.speculative.config import SpeculativeConfig
from workers.engine.speculative.drafter import Drafter
from workers.engine.speculative.stats import SpeculationStats


@dataclass
class _MeasuredStep:
    """A step the measured choice made, from its propose to its observe: what it yielded
    (cost_model.Realized) and, when it drafted by choice, its gain (stats.record_gain)."""

    choice: cost_model.Choice | None  # set when the choice drafted (not exploring)
    batch_size: int
    started: float  # perf_counter when the propose began
    drafted: bool = False
    tokens: int = 0  # emitted so far: each sampled sequence's accepted guesses plus its own token


class NoSpeculation:
    """Speculation off: no drafts, nothing to feed, nothing counted."""

    drafter = None
    stats = None
    feeds_states = False

    def propose(self, running, max_model_len: int, fail: Callable) -> dict[Sequence, list[int]]:
        return {}

    def keeps_states(self, num_running: int) -> bool:
        return False

    def record(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        pass

    def observe(self, batch, starts: list[int], aux, started: float, num_running: int) -> None:
        pass

    def release(self, seq: Sequence, completed: bool = False) -> None:
        pass

    def as_dict(self) -> dict | None:
        return None


class Speculator:
    def __init__(self, config: SpeculativeConfig, drafter: Drafter):
        self.config = config
        self.drafter = drafter
        self.stats = SpeculationStats(config.num_speculative_tokens)
        self.backoff = DraftBackoff(config.draft_backoff)
        # EAGLE-3 drafts from the target's hidden states: each step's rows are handed to it.
        self.feeds_states = drafter.aux_layer_ids is not None
        # choose_k "measured" (cost_model.py): what steps cost here, what drafts yield.
        self.measured = config.choose_k == "measured"
        self.costs = cost_model.StepCosts()
        self.realized = cost_model.Realized()
        self.history = cost_model.Acceptance()  # every sequence's runs: the prior
        self.acceptance: dict[Sequence, cost_model.Acceptance] = {}
        self.steps_in_bucket: dict[int, int] = {}
        # bucket -> choices in a row that chose to draft nothing (exploring aside): past
        # IDLE_AFTER of them the head is no longer fed at that batch size (nothing pays there),
        # until a choice drafts again or REFEED_AFTER choices have passed.
        self.idle_choices: dict[int, int] = {}
        self._step: _MeasuredStep | None = None  # this step's measured choice
        # A step exploring "no guesses" does not feed the head, so its time is an unfed step's;
        # its rows wait here and are fed before the next draft (the head then misses nothing).
        self._defer_feed = False
        self._deferred: list[tuple[Sequence, int, object]] = []
        # A sequence's prefill rows, fed with its first decode step: (first position, row blocks).
        self._prompts: dict[Sequence, tuple[int, list]] = {}
        self._prompt_feed: dict[Sequence, float] = {}  # feeding seconds so far of a prompt fed in chunks

    def active(self, num_running: int) -> bool:
        """Whether a step with this many running sequences drafts: small enough to pay."""
        return num_running <= self.config.disable_by_batch_size

    def keeps_states(self, num_running: int) -> bool:
        """Whether the step must keep the states a hidden-state drafter reads (a parallel group
        brings them to rank 0 only then). Measured: not at a batch size where IDLE_AFTER
        choices in a row were to draft nothing, so a batch where nothing pays does not feed the
        head either. (A sequence the head missed steps of drafts nothing with it: eagle3.py.)"""
        if not self.feeds_states or not self.active(num_running):
            return False
        return not self.measured or self.idle_choices.get(cost_model.bucket(num_running), 0) < cost_model.IDLE_AFTER

    def propose(self, running: list[Sequence], max_model_len: int, fail: Callable) -> dict[Sequence, list[int]]:
        """Drafts for this step's decoding sequences, or none when the batch is too large to pay.
        A sequence never gets more guesses than could be emitted: the step emits up to one more
        token than it accepts, within max_tokens and the context. A constrained sequence's draft
        is cut where its grammar refuses a token or ends, so verification only meets states the
        grammar can reach; a grammar that raises here fails its request (`fail(seq, exc)`)."""
        self._step, self._defer_feed = None, False
        if self._deferred:
            self._feed_entries(self._deferred)
            self._deferred = []
        if not self.active(len(running)):
            return {}
        started = time.perf_counter()
        seqs, limits = [], []
        for seq in running:
            if seq.num_computed_tokens != seq.num_tokens - 1:  # still prefilling
                continue
            if not self.backoff.allows(seq):  # its recent drafts were all rejected (backoff.py)
                continue
            room = min(self.config.num_speculative_tokens, max_model_len - seq.num_tokens - 1)
            if seq.params.max_tokens is not None:
                room = min(room, seq.params.max_tokens - seq.num_output_tokens - 1)
            if room > 0:
                seqs.append(seq)
                limits.append(room)
        num_decoding, exploring = len(seqs), False
        if self.measured and seqs:
            limits, exploring, choice = self._choose_k(seqs, limits, len(running))
            self._step = _MeasuredStep(choice if any(limits) and not exploring else None, len(running), started)
            self._defer_feed = exploring and not any(limits)
            if not exploring:
                self._count_idle(len(running), drafted=any(limits))
            seqs, limits = [s for s, k in zip(seqs, limits, strict=True) if k], [k for k in limits if k]
            if not seqs:
                self.stats.record_choice([0] * num_decoding)
        drafting = time.perf_counter()
        drafts = {}
        for seq, draft, n in zip(seqs, self.drafter.propose(seqs, limits) if seqs else [], limits, strict=True):
            try:
                draft = seq.grammar.valid_prefix(draft[:n]) if seq.grammar is not None else draft[:n]
            except Exception as exc:
                fail(seq, exc)
                continue
            if draft:
                drafts[seq] = draft
        now = time.perf_counter()
        self.stats.draft_seconds += now - started
        if self.measured and seqs:
            # What was drafted, not what was allowed: a drafter may have nothing to say.
            drafted = [len(drafts.get(seq, ())) for seq in seqs]
            self.stats.record_choice(drafted + [0] * (num_decoding - len(seqs)))
            self.costs.record_draft(len(running), max(drafted), now - drafting)
            self._step.drafted = any(drafted)
        return drafts

    def _count_idle(self, batch_size: int, drafted: bool) -> None:
        b = cost_model.bucket(batch_size)
        idle = 0 if drafted else self.idle_choices.get(b, 0) + 1
        if idle >= cost_model.REFEED_AFTER:
            # Now and then the head is fed again at a bucket that stopped, its drafting judged
            # afresh, so a change in what pays (the workload's acceptance, the load) is seen.
            idle = 0
            self.realized.forget(batch_size, "drafting")
        self.idle_choices[b] = idle

    def _choose_k(
        self, seqs: list[Sequence], limits: list[int], batch_size: int
    ) -> tuple[list[int], bool, cost_model.Choice]:
        """Guesses per sequence for this step (0 included), from the measured costs, whether
        this is an exploring step (every EXPLORE_EVERY-th step of a batch bucket takes the other
        side, drafting or not, so both stay measured), and the choice."""
        b = cost_model.bucket(batch_size)
        self.steps_in_bucket[b] = self.steps_in_bucket.get(b, 0) + 1
        exploring = self.steps_in_bucket[b] % cost_model.EXPLORE_EVERY == 0
        # Where drafting yielded less than not drafting, the choice is not even priced (on the
        # 2-core CPU the walk over 32 sequences costs a millisecond a step), except to explore.
        loses = self.realized.drafting_loses(batch_size, self.costs.prompt_feed_per_token())
        if loses and not exploring:
            return [0] * len(seqs), False, cost_model.Choice([0] * len(seqs), 0.0, [])
        prior = self.history.rates(max(limits), weight=1.0)
        none = cost_model.Acceptance()
        rates = [self.acceptance.get(seq, none).rates(n, prior) for seq, n in zip(seqs, limits, strict=True)]
        choice = cost_model.choose(rates, limits, self.costs, batch_size)
        if loses:
            choice.ks = [0] * len(choice.ks)
        if exploring:
            return ([0] * len(choice.ks) if any(choice.ks) else choice.drafting), True, choice
        return choice.ks, False, choice

    def record(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        """A sampled sequence's step: `num_accepted` of its `num_drafted` guesses were taken."""
        if self._step is not None:
            self._step.tokens += 1 + num_accepted
        if num_drafted:
            self.stats.record(num_drafted, num_accepted)
            self.backoff.record(seq, num_accepted)
            if self.measured:
                self.history.record(num_drafted, num_accepted)
                self.acceptance.setdefault(seq, cost_model.Acceptance()).record(num_drafted, num_accepted)

    def observe(self, batch, starts: list[int], aux, started: float, num_running: int) -> None:
        """After a step that began at `started` (perf_counter): count it if it verified drafts,
        and hand a hidden-state drafter each sequence's rows of `aux` for the positions whose
        K/V the step kept (all of a prefill chunk or decode; a verify's last token and accepted
        drafts), when the next step will draft (`num_running` now). A large batch's prefill is
        not fed: it would not draft."""
        if any(item.draft_token_ids for item in batch.all):
            self.stats.num_verify_steps += 1
            self.stats.verify_seconds += time.perf_counter() - started
        fed = self._feed(batch, starts, aux, num_running, defer=self._defer_feed)
        self._defer_feed = False
        # Prompts fed now are charged apart (cost_model's prompt_feed_per_token), not to the step.
        fed_seconds, prompt_seconds = fed if fed is not None else (0.0, 0.0)
        decoding = all(item.num_tokens == 1 + len(item.draft_token_ids) for item in batch.all)
        if self._step is not None:
            g, choice = self._step, self._step.choice
            # the draft pass, the step and the feeding
            seconds = time.perf_counter() - g.started - prompt_seconds
            if choice is not None:  # the choice's seconds carry the prompts' share: so do these
                measured = seconds + self.costs.prompt_feed_per_token() * g.tokens
                self.stats.record_gain(
                    choice.tokens, choice.seconds, g.tokens, measured, choice.plain_seconds, g.batch_size
                )
            if decoding:  # a plain step is counted without its feeding: "no guesses" feeds nothing
                side, spent = ("drafting", seconds) if g.drafted else ("plain", seconds - fed_seconds + prompt_seconds)
                self.realized.add(g.batch_size, side, g.tokens, spent)
            self._step = None
        if self.measured and decoding:
            # A decode or verify step (no prompt chunk in it): what it cost for its query tokens,
            # the head's feeding included (it is paid for drafting).
            seconds = time.perf_counter() - started - prompt_seconds
            tokens = sum(item.num_tokens for item in batch.all)
            self.costs.record_step(len(batch.all), tokens, seconds, fed=fed is not None)
            if fed is not None:
                self.costs.record_feed(len(batch.all), fed_seconds - prompt_seconds)

    def _feed(self, batch, starts: list[int], aux, num_running: int, defer: bool = False) -> tuple[float, float] | None:
        """Hand the head this step's states (or, with `defer`, keep them for the next propose):
        (seconds feeding took, the share of them spent on prompts), None when nothing was fed.

        A prefill chunk at a batch size that does not feed the head is kept, not dropped: it is
        fed with the sequence's first decode step if that step's batch size feeds the head (the
        batch shrank meanwhile), and dropped otherwise, so a request that decodes where drafting
        does not pay costs the head nothing."""
        for seq in batch.preempted:  # recomputed from its start when it runs again
            self._prompts.pop(seq, None)
        if aux is None:
            return None
        feeds = self.keeps_states(num_running)
        entries, row = [], 0
        for item, start in zip(batch.all, starts, strict=True):
            seq = item.seq
            rows = aux[row : row + seq.num_computed_tokens - start]
            row += item.num_tokens
            if seq.is_finished:
                self.drafter.release(seq)
                self._prompts.pop(seq, None)
                continue
            first, parts = self._prompts.pop(seq, (start, []))
            if parts and first + sum(len(p) for p in parts) != start:  # recomputed after a preemption
                first, parts = start, []
            if start < seq.num_prompt_tokens and not feeds:  # (part of) its prefill: kept until it decodes
                # a copy: a view would keep the whole step's states alive
                self._prompts[seq] = (first, [*parts, rows.clone()])
            elif feeds:
                entries.append((seq, first, torch.cat([*parts, rows]) if parts else rows))
        if defer:
            self._deferred = entries
            return None
        return self._feed_entries(entries) if entries else None

    def _feed_entries(self, entries: list) -> tuple[float, float]:
        """Feed the head: (seconds, the prompts' share by rows); each fed prompt's share is
        recorded (cost_model's prompt_feed_per_token)."""
        started = time.perf_counter()
        self.drafter.observe([e for e in entries if not e[0].is_finished])
        seconds = time.perf_counter() - started
        self.stats.draft_seconds += seconds
        rows = sum(len(aux) for _, _, aux in entries)
        prompt_seconds = 0.0
        for seq, start, aux in entries:
            prompt_rows = min(start + len(aux), seq.num_prompt_tokens) - start
            if prompt_rows > 0:
                share = seconds * prompt_rows / rows
                prompt_seconds += share
                spent = self._prompt_feed.pop(seq, 0.0) + share
                if start + len(aux) >= seq.num_prompt_tokens:  # the whole prompt: one sample a request
                    self.costs.record_prompt_feed(spent)
                else:  # a chunked prefill: the rest comes in the next steps
                    self._prompt_feed[seq] = spent
        return seconds, prompt_seconds

    def release(self, seq: Sequence, completed: bool = False) -> None:
        """Forget `seq`; `completed`: it ended as asked (not aborted or failed), so its answer's
        length counts in the prompt share (cost_model's prompt_feed_per_token)."""
        self.drafter.release(seq)
        self.acceptance.pop(seq, None)
        self._prompts.pop(seq, None)
        self._prompt_feed.pop(seq, None)
        if completed and self.feeds_states:
            self.costs.record_answer(seq.num_output_tokens)

    def as_dict(self) -> dict:
        out = self.stats.as_dict()
        if self.measured:  # sequences given k guesses by the measured choice, by k
            out["chosen_k"] = list(self.stats.chosen_k)
            out["gain_seconds"] = dict(self.stats.gain)
            out["expected_speedup"], out["measured_speedup"] = self.stats.speedups()
        return out
