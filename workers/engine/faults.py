"""Test-only faults: a request that makes the engine fail while stepping it, on purpose.

Off unless the engine's process has SWITCHYARD_TEST_FAULTS=1 in its environment (tests set it
for the replicas they start; no deployment sets it). Then a request whose grammar is a regex of
exactly one of these patterns gets a grammar state that misbehaves once the request has
generated two tokens (so it has streamed output first, as a real fault mid-answer would):

    switchyard-test-fault   raises from the sampler's mask: the engine must contain it, ending
                            that request alone with an error
    switchyard-test-crash   ends the process at once (exit code 70): what a fault the engine
                            cannot contain does to a replica, for failover and failure budgets

Everything else about such a request is ordinary, so it can share a batch with real ones.
"""

from __future__ import annotations

import os

FAULT = "switchyard-test-fault"
CRASH = "switchyard-test-crash"
CRASH_EXIT_CODE = 70  # EX_SOFTWARE
TOKENS_BEFORE_FAULT = 2


def enabled() -> bool:
    return os.environ.get("SWITCHYARD_TEST_FAULTS") == "1"


def injected_fault(spec: dict, vocab_size: int) -> FaultyGrammar | None:
    """The faulty grammar state for `spec`, or None (always None unless faults are enabled)."""
    if spec.get("type") != "regex" or spec.get("regex") not in (FAULT, CRASH) or not enabled():
        return None
    return FaultyGrammar(crash=spec["regex"] == CRASH, vocab_size=vocab_size)


class FaultyGrammar:
    """A GrammarState look-alike that allows every token, then fails (see the module's docstring)."""

    def __init__(self, crash: bool, vocab_size: int):
        self.crash = crash
        self.accepted = 0
        self.vocab_size = vocab_size

    def accept(self, token: int) -> bool:
        self.accepted += 1
        return True

    def rollback(self, n: int) -> None:
        self.accepted -= n

    def valid_prefix(self, tokens: list[int]) -> list[int]:
        return list(tokens)

    @property
    def terminated(self) -> bool:
        return False

    def fill(self, bitmask, row: int) -> None:
        if self.accepted >= TOKENS_BEFORE_FAULT:
            if self.crash:
                os._exit(CRASH_EXIT_CODE)
            raise RuntimeError(f"injected fault ({FAULT}) after {self.accepted} tokens")
        bitmask[row] = -1  # every bit set: any token
