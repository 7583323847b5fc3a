"""A seeded agent trace for the cache benchmark: what an agent harness sends, as token ids.

Every session starts from one shared prefix (a system prompt, then a tool schema), adds a user
task, and then runs 8–30 turns; each turn sends the whole context so far, which grows by the
assistant's tool call and the tool's result. Between two turns the harness "runs the tool" (a
think time). Some sessions fork sub-agents: each starts from the parent's context at one of its
turns (turn 0 included: spawned before any answer arrived), adds its own task, runs its own
turns concurrently with the parent, and sends the parent's session key (the harness's session).

The assistant turns are part of the trace (a recording), not the model's answers: each prompt is
fixed token ids whatever the model said, so every routing policy replays exactly the same
prompts, and `ideal_hit_rate` is a property of the trace alone.

Nothing is stored: `make_trace(seed)` rebuilds the same trace from its seed on any machine
(Python's `random.Random` is stable across versions for these calls).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from workers.protocol.kv_blocks import prefix_hashes

SEED = 13
# Token ids drawn for the trace: ordinary tokens of the demo tokenizer (its specials and tool
# tags sit below 16).
LOW_TOKEN, HIGH_TOKEN = 16, 1000


@dataclass(frozen=True)
class Shape:
    """The knobs of a trace. The defaults make one policy's replay take about two minutes on
    four one-thread CPU replicas of the benchmark model (two cores)."""

    sessions: int = 20  # root sessions (sub-agents come on top)
    system_tokens: int = 384
    tools_tokens: int = 256
    context_tokens: tuple[int, int] = (600, 1800)  # the session's own context (a project's files)
    task_tokens: tuple[int, int] = (40, 160)
    turns: tuple[int, int] = (8, 30)
    sub_turns: tuple[int, int] = (8, 14)
    call_tokens: tuple[int, int] = (12, 32)  # the assistant's tool call
    result_median: float = 100.0  # tool results: log-normal tokens, clipped to result_tokens
    result_tokens: tuple[int, int] = (16, 480)
    max_context: int = 5120  # a tool result is truncated (as harnesses do) to stay under this
    think_median: float = 2.0  # seconds between an answer and the next turn (the tool runs)
    think_range: tuple[float, float] = (0.3, 8.0)
    arrival_seconds: float = 60.0  # root sessions start over this window (Poisson)
    fork_probability: float = 0.3
    forks: tuple[int, int] = (1, 3)


QUICK = Shape(
    sessions=6,
    system_tokens=320,
    tools_tokens=192,
    context_tokens=(100, 400),
    turns=(8, 10),
    sub_turns=(8, 8),
    result_median=60.0,
    result_tokens=(16, 160),
    max_context=2048,
    think_median=0.3,
    think_range=(0.1, 1.0),
    arrival_seconds=3.0,
    fork_probability=0.5,
    forks=(1, 2),
)


@dataclass
class Session:
    """One conversation: `tokens` is its whole context, turn i sends `tokens[: ends[i]]` after
    waiting `thinks[i]` seconds (from the previous answer; for turn 0 from its start). A root
    session starts `start` seconds into the replay; a sub-agent (`parent` set) when its parent's
    turn `fork_turn` is sent (0) or answered (later turns)."""

    index: int
    key: str  # the session key its requests carry (a sub-agent carries its parent's)
    tokens: list[int]
    ends: list[int]
    thinks: list[float]
    start: float = 0.0
    parent: int | None = None
    fork_turn: int = 0
    children: list[int] = field(default_factory=list)

    def prompt(self, turn: int) -> list[int]:
        return self.tokens[: self.ends[turn]]


@dataclass
class Trace:
    shape: Shape
    seed: int
    sessions: list[Session]
    _hashes: dict[tuple[int, int, int], list[int]] = field(default_factory=dict, repr=False)

    @property
    def requests(self) -> int:
        return sum(len(s.ends) for s in self.sessions)

    @property
    def prompt_tokens(self) -> int:
        return sum(sum(s.ends) for s in self.sessions)

    def block_hashes(self, session: int, turn: int, block_size: int) -> list[int]:
        """`prefix_hashes` of one request's prompt (remembered: every policy asks again)."""
        key = (session, turn, block_size)
        if key not in self._hashes:
            self._hashes[key] = prefix_hashes(self.sessions[session].prompt(turn), block_size)
        return self._hashes[key]

    def nominal_order(self) -> list[tuple[float, int, int]]:
        """(time, session, turn) of every request if answers took no time: the order in which
        "earlier" is meant by the ideal hit rate."""
        times: dict[tuple[int, int], float] = {}
        out = []
        for s in self.sessions:  # parents come before their sub-agents
            if s.parent is None:
                t = s.start
            else:
                t = times[(s.parent, s.fork_turn)]
            for turn, think in enumerate(s.thinks):
                t += think
                times[(s.index, turn)] = t
                out.append((t, s.index, turn))
        return sorted(out)

    def ideal_hit_rate(self, block_size: int) -> float:
        """Input-token hit rate with an infinite cache and perfect routing: each request reuses
        the longest prefix, in whole blocks as the engine counts them (at most (n-1)//B), that
        any earlier request of the trace computed."""
        seen: set[int] = set()
        hit = total = 0
        for _, si, turn in self.nominal_order():
            hashes = self.block_hashes(si, turn, block_size)
            reused = 0
            while reused < len(hashes) and hashes[reused] in seen:
                reused += 1
            seen.update(hashes)
            hit += reused * block_size
            total += self.sessions[si].ends[turn]
        return hit / total if total else 0.0


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(LOW_TOKEN, HIGH_TOKEN) for _ in range(n)]


def _think(rng: random.Random, shape: Shape) -> float:
    lo, hi = shape.think_range
    return round(min(max(rng.lognormvariate(math.log(shape.think_median), 0.6), lo), hi), 3)


def _turns(rng: random.Random, bounds: tuple[int, int]) -> int:
    """Between the bounds, short sessions the most common (mean (2·lo + hi) / 3)."""
    lo, hi = bounds
    return min(int(rng.triangular(lo, hi + 1, lo)), hi)


def _grow(rng: random.Random, shape: Shape, session: Session, turns: int) -> None:
    """Add `turns` turns: each but the first appends a tool call and its (truncated) result."""
    for turn in range(turns):
        if session.ends:  # the first turn sends what the session starts with
            call = _tokens(rng, rng.randint(*shape.call_tokens))
            lo, hi = shape.result_tokens
            size = min(max(int(rng.lognormvariate(math.log(shape.result_median), 0.8)), lo), hi)
            room = max(shape.max_context - len(session.tokens), 0)
            session.tokens += (call + _tokens(rng, size))[:room]
        session.ends.append(len(session.tokens))
        session.thinks.append(0.0 if turn == 0 else _think(rng, shape))


def make_trace(seed: int = SEED, shape: Shape | None = None, sessions: int | None = None) -> Trace:
    """The trace for `seed`: the same sessions, prompts and think times on every call."""
    shape = shape or Shape()
    rng = random.Random(seed)
    prefix = _tokens(rng, shape.system_tokens) + _tokens(rng, shape.tools_tokens)
    out: list[Session] = []
    t = 0.0
    n = sessions if sessions is not None else shape.sessions
    rate = n / shape.arrival_seconds if shape.arrival_seconds > 0 else math.inf
    for i in range(n):
        own = _tokens(rng, rng.randint(*shape.context_tokens)) + _tokens(rng, rng.randint(*shape.task_tokens))
        root = Session(len(out), f"s{i}", prefix + own, [], [], start=t)
        _grow(rng, shape, root, _turns(rng, shape.turns))
        out.append(root)
        if rng.random() < shape.fork_probability:
            fork_turn = rng.choice([0, *range(2, len(root.ends) - 2)])
            for _ in range(rng.randint(*shape.forks)):
                task = _tokens(rng, rng.randint(12, 32)) + _tokens(rng, rng.randint(*shape.task_tokens))
                start = (root.prompt(fork_turn) + task)[: shape.max_context]
                sub = Session(len(out), root.key, start, [], [], parent=root.index, fork_turn=fork_turn)
                _grow(rng, shape, sub, _turns(rng, shape.sub_turns))
                sub.thinks[0] = round(rng.uniform(0.0, 0.2), 3)  # spawned at once
                root.children.append(sub.index)
                out.append(sub)
        t += rng.expovariate(rate) if rate != math.inf else 0.0
    return Trace(shape, seed, out)
