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

    def record_choice(self, ks: list[int]) -> None:
        for k in ks:
            self.chosen_k[k] += 1

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
