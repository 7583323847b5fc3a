"""How many tokens each sequence drafts this step, chosen from what this engine measures.

A fixed k with a fixed batch threshold (`disable_by_batch_size`) pays only on the machine it was
tuned on: on the 2-core CPU a 4-token verify costs 1.7x a decode step, on a GPU about 1x. With
`choose_k: "measured"` the speculator asks this module instead, every step:

- **Step costs** (`StepCosts`): an EWMA of the seconds a decode or verify step takes, per batch
  bucket (1, 2, 4, 8, ...) and by the guesses the step verifies (0 = a plain decode step);
  between measured counts the cost is interpolated, beyond them extrapolated from the last two;
  a verify never measured is assumed to cost a decode step (a GPU's), so it is tried and then
  known. The head's feeding (EAGLE-3 reads every step's states) is part of each step's time. And
  an EWMA of the draft seconds per drafted position (EAGLE-3 runs one
  batched pass per position; prompt lookup costs next to nothing).
- **Acceptance** (`Acceptance`): per draft position j, the chance that guess j is accepted once
  the guesses before it were: the engine's history since it started is the prior, each sequence's
  own runs move it (`PRIOR_WEIGHT` pseudo-runs against its real ones).
- **The choice** (`choose`): expected tokens of sequence i drafting k_i is
  E_i(k_i) = 1 + sum over m <= k_i of prod over j < m of a_ij; the step yields sum E_i in
  T(B, sum k_i) + D * max k_i seconds. Starting from k = 0 for everyone (always a
  candidate), one more guess goes to the sequence whose next guess is likeliest accepted, until
  every sequence is at its limit; the best tokens-per-second seen on that path is the choice.
  For a fixed total of guesses the likeliest ones yield the most tokens, so the path visits the
  best assignment of each total; with a draft cost the path is walked once per cap on the longest
  draft, which makes the choice the exact maximum (tests compare it with every assignment).
- **Exploration**: every `EXPLORE_EVERY`th step of a bucket takes the best choice that drafts when
  the best is not to draft, and not to draft when the best is to draft, so both costs stay
  measured as the machine's load and the acceptance change (bounded cost: one step in 32). A
  step that explores not drafting does not feed the head either (its rows are fed before the
  next draft: speculator.py), so what "no guesses" costs is measured, not derived.
- **The prompt's feeding**: a head that drafts from hidden states reads the prompt of every
  request it may draft for. That is paid once a request, so each token a drafting step emits
  carries a share of it: the measured feeding of a prompt over the measured answer length
  (`prompt_feed_per_token`). With short answers at a large batch that share decides (bench spec,
  chat at batch 8). The prompt is fed with the request's first decode step, and only when that
  step's batch size still feeds the head (speculator.py).
- **The realized check** (`Realized`): the tables price each part of a step apart, from samples
  spread over many (bucket, guesses) cells, so near the break-even point their sum can be wrong
  by more than the margin (chat at batch 8 on the 2-core CPU: the tables expected 1.38x where the
  pass ran at 0.8x). So each bucket also keeps what its decode steps actually yielded: tokens
  emitted against seconds spent from the propose to the end of the feeding, for steps that
  drafted and for steps that did not (their feeding taken out: not drafting feeds nothing).
  While the drafting steps, charged the prompts' share, yielded fewer tokens a second than the
  plain ones, the bucket drafts only to explore, and is not priced otherwise.
- **Idle buckets**: after IDLE_AFTER choices in a row to draft nothing at a bucket, the head is
  no longer fed there (its steps, and the prompts of requests that start decoding there, cost it
  nothing); after REFEED_AFTER it is fed again and drafting there is judged afresh.

Drafts change only how fast tokens come, never which ones, so no choice here can change an output.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field

# EWMA weight of a new measurement: recent steps count, one slow step does not decide.
ALPHA = 0.2
EXPLORE_EVERY = 32
# After this many choices in a row to draft nothing, a bucket stops feeding the head; after
# REFEED_AFTER it feeds it again and judges drafting afresh.
IDLE_AFTER = 8
REFEED_AFTER = 8 * EXPLORE_EVERY
# The realized check acts once each side has this many steps, and remembers longer than the
# tables: a bucket it turns off stops feeding the head, so its verdict must not be one bad run's.
MIN_REALIZED = {"drafting": 16, "plain": 4}
REALIZED_ALPHA = 0.05
# Pseudo-runs the engine-wide acceptance counts as, against a sequence's own runs.
PRIOR_WEIGHT = 4.0
# Before anything was verified: an acceptance worth trying (measured, it is replaced).
FIRST_GUESS = 0.6


def bucket(batch_size: int) -> int:
    """The power of two at or above `batch_size`: steps of 5 to 8 sequences cost alike."""
    b = 1
    while b < batch_size:
        b *= 2
    return b


class Ewma:
    __slots__ = ("alpha", "value")

    def __init__(self, alpha: float = ALPHA) -> None:
        self.alpha = alpha
        self.value: float | None = None

    def add(self, x: float) -> None:
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)


class StepCosts:
    """Measured seconds per step, per batch bucket and extra query tokens (the guesses verified:
    0 = a plain decode step), and draft seconds per drafted position."""

    def __init__(self) -> None:
        self.step: dict[int, dict[int, Ewma]] = {}  # bucket -> guesses in the step -> seconds
        self.draft: dict[int, Ewma] = {}  # bucket -> seconds per drafted position
        # A head that drafts from hidden states is fed every step while it may draft: a plain
        # step then costs more than one of an engine that does not speculate (the states kept,
        # the head's pass over them). Not drafting at a batch size means not feeding there
        # either, so "no guesses" is priced as a step without feeding (`off_seconds`).
        self.unfed: dict[int, Ewma] = {}  # bucket -> seconds of a plain step that fed nothing
        self.feed: dict[int, Ewma] = {}  # bucket -> seconds of the feeding in a step
        self.prompt_feed = Ewma()  # seconds of feeding one request's prompt to the head
        self.answer_tokens = Ewma()  # tokens of a finished request's answer

    def record_step(self, batch_size: int, query_tokens: int, seconds: float, fed: bool = False) -> None:
        """A decode or verify step's seconds (its feeding included); `fed`: it fed the head."""
        extra = max(0, query_tokens - batch_size)
        self.step.setdefault(bucket(batch_size), {}).setdefault(extra, Ewma()).add(seconds)
        if extra == 0 and not fed:
            self.unfed.setdefault(bucket(batch_size), Ewma()).add(seconds)

    def record_feed(self, batch_size: int, seconds: float) -> None:
        self.feed.setdefault(bucket(batch_size), Ewma()).add(seconds)

    def off_seconds(self, batch_size: int, curve) -> float:
        """What a plain step costs when nothing is drafted or fed at this batch size: measured
        once the head went unfed here, until then a fed plain step less its feeding."""
        b = bucket(batch_size)
        unfed = self.unfed.get(b)
        if unfed is not None and unfed.value is not None:
            return unfed.value
        feed = self.feed.get(b)
        return max(curve(0) - (feed.value if feed is not None and feed.value is not None else 0.0), 1e-9)

    def record_prompt_feed(self, seconds: float) -> None:
        """A request's prompt was fed to the head, in `seconds` over its prefill steps."""
        self.prompt_feed.add(seconds)

    def record_answer(self, tokens: int) -> None:
        self.answer_tokens.add(tokens)

    def prompt_feed_per_token(self) -> float:
        """Seconds of prompt feeding each emitted token carries while drafting goes on: a
        prompt's feeding over an answer's length (0 until both were measured)."""
        feed, answer = self.prompt_feed.value, self.answer_tokens.value
        return feed / answer if feed is not None and answer else 0.0

    def record_draft(self, batch_size: int, positions: int, seconds: float) -> None:
        if positions > 0:
            self.draft.setdefault(bucket(batch_size), Ewma()).add(seconds / positions)

    def curve(self, batch_size: int):
        """T(guesses) for this bucket, or None while no step of it was measured at all: linear
        between measured points (made non-decreasing), the last slope beyond them; with only plain steps measured, a
        verify is assumed to cost a decode step (a GPU's), so it is tried and then known."""
        table = {x: e.value for x, e in self.step.get(bucket(batch_size), {}).items()}
        if not table:
            return None
        if 0 not in table:  # only verifies measured: a decode costs no more than the cheapest
            table[0] = min(table.values())
        xs = sorted(table)
        # A step of more query tokens never costs less: a verify measured below a smaller one is
        # noise (few samples, a quiet moment), so each point is at least the one before it.
        ts = [table[x] for x in xs]
        for i in range(1, len(ts)):
            ts[i] = max(ts[i], ts[i - 1])
        slope = max(0.0, (ts[-1] - ts[-2]) / (xs[-1] - xs[-2])) if len(xs) > 1 else 0.0

        def seconds(extra: float) -> float:
            if extra >= xs[-1]:
                return ts[-1] + slope * (extra - xs[-1])
            hi = bisect.bisect_right(xs, extra)
            if hi == 0:
                return ts[0]
            lo = hi - 1
            return ts[lo] + (ts[hi] - ts[lo]) * (extra - xs[lo]) / (xs[hi] - xs[lo])

        return seconds

    def step_seconds(self, batch_size: int, extra: float) -> float | None:
        """T(B, guesses), or None while no step of this bucket was measured."""
        curve = self.curve(batch_size)
        return None if curve is None else curve(extra)

    def draft_seconds(self, batch_size: int) -> float:
        e = self.draft.get(bucket(batch_size))
        return e.value if e is not None and e.value is not None else 0.0


class Realized:
    """Per batch bucket, what drafting steps and plain unfed steps yielded: EWMAs of the tokens
    a step emitted and of the seconds it took (their ratio weighs each step by its length)."""

    def __init__(self) -> None:
        self.sides: dict[tuple[int, str], tuple[Ewma, Ewma]] = {}
        self.counts: dict[tuple[int, str], int] = {}

    def add(self, batch_size: int, side: str, tokens: int, seconds: float) -> None:
        key = (bucket(batch_size), side)
        tok, sec = self.sides.setdefault(key, (Ewma(REALIZED_ALPHA), Ewma(REALIZED_ALPHA)))
        tok.add(tokens)
        sec.add(seconds)
        self.counts[key] = self.counts.get(key, 0) + 1

    def forget(self, batch_size: int, side: str) -> None:
        key = (bucket(batch_size), side)
        self.sides.pop(key, None)
        self.counts.pop(key, None)

    def rate(self, batch_size: int, side: str, per_token: float = 0.0) -> float | None:
        """Tokens per second of `side`'s steps, `per_token` seconds added to each token; None
        while fewer than MIN_REALIZED of them were seen."""
        key = (bucket(batch_size), side)
        if self.counts.get(key, 0) < MIN_REALIZED[side]:
            return None
        tok, sec = self.sides[key]
        return tok.value / (sec.value + per_token * tok.value)

    def drafting_loses(self, batch_size: int, prompt_share: float) -> bool:
        """Whether this bucket's drafting steps, charged `prompt_share` seconds a token for the
        prompts' feeding, yielded fewer tokens a second than its plain steps."""
        drafting = self.rate(batch_size, "drafting", prompt_share)
        plain = self.rate(batch_size, "plain")
        return drafting is not None and plain is not None and drafting < plain


@dataclass
class Acceptance:
    """Draft runs that reached position j, and those whose guess j was accepted."""

    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    def record(self, num_drafted: int, num_accepted: int) -> None:
        grow = num_drafted - len(self.reached)
        if grow > 0:
            self.reached += [0] * grow
            self.accepted += [0] * grow
        # A guess is judged only when every guess before it was accepted.
        for j in range(min(num_drafted, num_accepted + 1)):
            self.reached[j] += 1
        for j in range(num_accepted):
            self.accepted[j] += 1

    def rates(self, k: int, prior: list[float] | None = None, weight: float = PRIOR_WEIGHT) -> list[float]:
        """The chance guess j (j < k) is accepted once the guesses before it were."""
        out = []
        for j in range(k):
            p = prior[j] if prior is not None and j < len(prior) else FIRST_GUESS
            n = self.reached[j] if j < len(self.reached) else 0
            a = self.accepted[j] if j < len(self.accepted) else 0
            out.append((p * weight + a) / (weight + n) if weight + n else p)
        return out


def expected_tokens(rates: list[float], k: int) -> float:
    """Tokens a sequence yields drafting k guesses: the target's own plus the accepted ones."""
    total, chain = 1.0, 1.0
    for j in range(k):
        chain *= rates[j]
        total += chain
    return total


def _greedy_path(rates: list[list[float]], limits: list[int]):
    """(ks, expected extra tokens, guesses in all, longest draft) from k = 0 for everyone, one
    guess more each time, to the sequence whose next guess is likeliest accepted. `ks` is the
    same list throughout: copy what you keep."""
    ks = [0] * len(limits)
    extra, drafted, longest = 0.0, 0, 0
    yield ks, extra, drafted, longest
    # A sequence's chance of its next guess being accepted only falls as it drafts more.
    heap = [(-rates[i][0], i) for i, n in enumerate(limits) if n > 0]
    heapq.heapify(heap)
    while heap:
        negative, i = heapq.heappop(heap)
        ks[i] += 1
        extra -= negative
        drafted += 1
        longest = max(longest, ks[i])
        if ks[i] < limits[i]:
            heapq.heappush(heap, (negative * rates[i][ks[i]], i))
        yield ks, extra, drafted, longest


@dataclass
class Choice:
    ks: list[int]  # guesses per sequence maximising the step's expected tokens per second
    rate: float  # ... that rate (0 when nothing was measured yet)
    drafting: list[int]  # the best choice that drafts at all (what exploration runs)
    tokens: float = 0.0  # the tokens `ks`' step is expected to emit
    seconds: float = 0.0  # ... and its expected seconds, the draft pass included
    plain_seconds: float = 0.0  # what a step that drafts and feeds nothing costs (off_seconds)


def choose(rates: list[list[float]], limits: list[int], costs: StepCosts, batch_size: int) -> Choice:
    """`rates[i]`: sequence i's acceptance by position (at least `limits[i]` long); `batch_size`:
    every sequence the step runs (those not drafting count one query token each)."""
    curve = costs.curve(batch_size)
    if curve is None:  # nothing measured in this bucket: a plain step measures it
        return Choice([0] * len(limits), 0.0, [min(1, n) for n in limits])
    draft_each = costs.draft_seconds(batch_size)
    off = costs.off_seconds(batch_size, curve)
    prompt_share = costs.prompt_feed_per_token()  # paid per token while drafting, not when off
    best = drafting = None
    # A draft pass per position: the longest draft costs too. Walking the path once per cap on
    # the longest finds, for every total and longest, the likeliest guesses, so the best of all;
    # a draft pass too cheap to matter (prompt lookup's) needs one walk.
    caps = range(1, max(limits) + 1) if draft_each > 0.01 * curve(0) else [max(limits)]
    for cap in caps:
        for ks, extra, drafted, longest in _greedy_path(rates, [min(n, cap) for n in limits]):
            tokens = batch_size + extra
            seconds = curve(drafted) + draft_each * longest + prompt_share * tokens if drafted else off
            rate = tokens / seconds
            if best is None or rate > best[1]:
                best = (list(ks), rate, tokens, seconds)
            if drafted and (drafting is None or rate > drafting[1]):
                drafting = (list(ks), rate)
    return Choice(best[0], best[1], drafting[0] if drafting is not None else best[0], best[2], best[3], off)
