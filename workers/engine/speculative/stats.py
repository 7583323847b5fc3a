"""Counters of what speculation did, for the replica to report (per engine, since start)."""

from __future__ import annotations


class SpeculationStats:
    def __init__(self, k: int):
        self.num_verify_steps = 0  # engine steps that verified at least one draft
        self.num_drafts = 0  # draft runs verified (one per sequence per such step)
        self.drafted = [0] * k  # draft runs that reached position j (0-based)
        self.accepted = [0] * k  # ... and whose draft at position j was accepted
        self.draft_seconds = 0.0  # proposing drafts (and, for EAGLE-3, feeding the head)
        self.verify_seconds = 0.0  # target steps that verified drafts, sampling included
        self.chosen_k = [0] * (k + 1)  # choose_k "measured": sequences given k guesses, by k
        # choose_k "measured", over the steps it chose to draft in: the seconds their tokens would
        # have taken in plain decode steps (tokens / B x T(B, 0)) and the seconds they took,
        # as the cost model expected and as measured. Each ratio is a speed-up.
        self.gain = {"expected_plain": 0.0, "expected": 0.0, "measured_plain": 0.0, "measured": 0.0}

    def record_choice(self, ks: list[int]) -> None:
        for k in ks:
            self.chosen_k[k] += 1

    def record_gain(self, expected_tokens: float, expected_seconds: float, tokens: int, seconds: float,
                    plain_seconds: float, batch_size: int) -> None:  # fmt: skip
        """One step the measured choice drafted in: `expected_tokens` in `expected_seconds` was its
        expectation, `tokens` in `seconds` what happened; a plain step of `batch_size` sequences
        costs `plain_seconds` and yields `batch_size` tokens."""
        per_token = plain_seconds / batch_size
        self.gain["expected_plain"] += expected_tokens * per_token
        self.gain["expected"] += expected_seconds
        self.gain["measured_plain"] += tokens * per_token
        self.gain["measured"] += seconds

    def speedups(self) -> tuple[float | None, float | None]:
        """(expected, measured) speed-up of the steps the measured choice drafted in."""
        g = self.gain
        return (
            g["expected_plain"] / g["expected"] if g["expected"] else None,
            g["measured_plain"] / g["measured"] if g["measured"] else None,
        )

    def record(self, num_drafted: int, num_accepted: int) -> None:
        """One sequence's draft run: `num_drafted` guesses, the first `num_accepted` accepted."""
        self.num_drafts += 1
        for j in range(num_drafted):
            self.drafted[j] += 1
        for j in range(num_accepted):
            self.accepted[j] += 1

    def as_dict(self) -> dict:
        accepted = sum(self.accepted)
        drafted = sum(self.drafted)
        return {
            "num_verify_steps": self.num_verify_steps,
            "num_drafts": self.num_drafts,
            "num_draft_tokens": drafted,
            "num_accepted_tokens": accepted,
            "drafted_per_position": list(self.drafted),
            "accepted_per_position": list(self.accepted),
            # Tokens a draft run yields: its accepted drafts plus the target's own token.
            "mean_acceptance_length": 1 + accepted / self.num_drafts if self.num_drafts else None,
            "acceptance_rate": accepted / drafted if drafted else None,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
        }
