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

from workers.engine.sequence import Sequence
from workers.engine.speculative import cost_model
from workers.engine.speculative.backoff import DraftBackoff
from workers.engine.speculative.config import SpeculativeConfig
from workers.engine.speculative.drafter import Drafter
from workers.engine.speculative.stats import SpeculationStats


@dataclass
class _GainStep:
    """A step the measured choice drafted in, from its propose to its observe (stats.record_gain)."""

    choice: cost_model.Choice
    batch_size: int
    started: float  # perf_counter when drafting began
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

    def release(self, seq: Sequence) -> None:
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
        self.history = cost_model.Acceptance()  # every sequence's runs: the prior
        self.acceptance: dict[Sequence, cost_model.Acceptance] = {}
        self.steps_in_bucket: dict[int, int] = {}
        # bucket -> choices in a row that drafted nothing: past EXPLORE_EVERY of them the head is
        # no longer fed at that batch size (nothing pays there), until a choice drafts again.
        self.idle_choices: dict[int, int] = {}
        # This step's measured choice, while it drafts: expected against measured gain.
        self._gain: _GainStep | None = None

    def active(self, num_running: int) -> bool:
        """Whether a step with this many running sequences drafts: small enough to pay."""
        return num_running <= self.config.disable_by_batch_size

    def keeps_states(self, num_running: int) -> bool:
        """Whether the step must keep the states a hidden-state drafter reads (a parallel group
        brings them to rank 0 only then). Measured: not at a batch size where EXPLORE_EVERY
        choices in a row drafted nothing, so a batch where nothing pays does not feed the head
        either. (A sequence the head missed steps of drafts nothing with it: eagle3.py.)"""
        if not self.feeds_states or not self.active(num_running):
            return False
        return not self.measured or self.idle_choices.get(cost_model.bucket(num_running), 0) < cost_model.EXPLORE_EVERY

    def propose(self, running: list[Sequence], max_model_len: int, fail: Callable) -> dict[Sequence, list[int]]:
        """Drafts for this step's decoding sequences, or none when the batch is too large to pay.
        A sequence never gets more guesses than could be emitted: the step emits up to one more
        token than it accepts, within max_tokens and the context. A constrained sequence's draft
        is cut where its grammar refuses a token or ends, so verification only meets states the
        grammar can reach; a grammar that raises here fails its request (`fail(seq, exc)`)."""
        self._gain = None
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
            if any(limits) and not exploring:
                self._gain = _GainStep(choice, len(running), started)
            seqs, limits = [s for s, k in zip(seqs, limits, strict=True) if k], [k for k in limits if k]
            if not seqs:
                self.stats.record_choice([0] * num_decoding)
                self._count_idle(len(running), drafted=False)
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
            # A choice to draft that found nothing to say (the head not fed yet) is not idle.
            self._count_idle(len(running), drafted=any(drafted) or not exploring)
        return drafts

    def _count_idle(self, batch_size: int, drafted: bool) -> None:
        b = cost_model.bucket(batch_size)
        self.idle_choices[b] = 0 if drafted else self.idle_choices.get(b, 0) + 1

    def _choose_k(
        self, seqs: list[Sequence], limits: list[int], batch_size: int
    ) -> tuple[list[int], bool, cost_model.Choice]:
        """Guesses per sequence for this step (0 included), from the measured costs, whether
        this is an exploring step (every EXPLORE_EVERY-th step of a batch bucket takes the other
        side, drafting or not, so both stay measured), and the choice."""
        prior = self.history.rates(max(limits), weight=1.0)
        none = cost_model.Acceptance()
        rates = [self.acceptance.get(seq, none).rates(n, prior) for seq, n in zip(seqs, limits, strict=True)]
        choice = cost_model.choose(rates, limits, self.costs, batch_size)
        b = cost_model.bucket(batch_size)
        self.steps_in_bucket[b] = self.steps_in_bucket.get(b, 0) + 1
        if self.steps_in_bucket[b] % cost_model.EXPLORE_EVERY == 0:
            return ([0] * len(choice.ks) if any(choice.ks) else choice.drafting), True, choice
        return choice.ks, False, choice

    def record(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        """A sampled sequence's step: `num_accepted` of its `num_drafted` guesses were taken."""
        if self._gain is not None:
            self._gain.tokens += 1 + num_accepted
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
        fed = self._feed(batch, starts, aux, num_running)
        if self._gain is not None:
            g, choice = self._gain, self._gain.choice
            seconds = time.perf_counter() - g.started  # the draft pass, the step and the feeding
            self.stats.record_gain(choice.tokens, choice.seconds, g.tokens, seconds, choice.plain_seconds, g.batch_size)
            self._gain = None
        if self.measured and all(item.num_tokens == 1 + len(item.draft_token_ids) for item in batch.all):
            # A decode or verify step (no prompt chunk in it): what it cost for its query tokens,
            # the head's feeding included (it is paid for drafting).
            seconds = time.perf_counter() - started
            tokens = sum(item.num_tokens for item in batch.all)
            self.costs.record_step(len(batch.all), tokens, seconds, fed=fed is not None)
            if fed is not None:
                self.costs.record_feed(len(batch.all), fed)

    def _feed(self, batch, starts: list[int], aux, num_running: int) -> float | None:
        """Hand the head this step's states; the seconds that took, None when it was not fed."""
        if aux is None or not self.keeps_states(num_running):
            return None
        started = time.perf_counter()
        entries, row = [], 0
        for item, start in zip(batch.all, starts, strict=True):
            seq = item.seq
            if seq.is_finished:
                self.drafter.release(seq)
            else:
                entries.append((seq, start, aux[row : row + seq.num_computed_tokens - start]))
            row += item.num_tokens
        self.drafter.observe(entries)
        seconds = time.perf_counter() - started
        self.stats.draft_seconds += seconds
        return seconds

    def release(self, seq: Sequence) -> None:
        self.drafter.release(seq)
        self.acceptance.pop(seq, None)

    def as_dict(self) -> dict:
        out = self.stats.as_dict()
        if self.measured:  # sequences given k guesses by the measured choice, by k
            out["chosen_k"] = list(self.stats.chosen_k)
            out["gain_seconds"] = dict(self.stats.gain)
            out["expected_speedup"], out["measured_speedup"] = self.stats.speedups()
        return out
