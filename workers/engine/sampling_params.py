"""Per-request generation settings, validated on construction (vLLM's names and meanings).

The checks are complete on purpose: what constructs must get through every engine step. A
value that failed later (a seed past torch's range, a huge integer, a string where a number
goes) would fail inside `step()`, which runs the whole batch, so one bad request would end
every other one. Each error is a RequestError naming the field.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workers.engine.errors import RequestError

# A grammar spec's checks are the protocol's, shared with the gateway (re-exported for the engine).
from workers.protocol.grammar import GRAMMAR_PARAMS, MAX_SPEC_BYTES, check_grammar

__all__ = ["GRAMMAR_PARAMS", "MAX_SPEC_BYTES", "SamplingParams", "check_grammar", "check_logit_bias"]

if TYPE_CHECKING:
    from workers.protocol.replica import WireSamplingParams

SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed's range (it wraps negative seeds; we refuse them)
MAX_LOGPROBS = 20
MAX_N = 128  # samples per request the engine takes (the gateway's own limit is lower)
LOGIT_BIAS_MAX = 100.0  # OpenAI's range for a logit_bias value, either sign
# Below this a temperature is greedy: dividing fp32 logits by it would overflow them to inf.
GREEDY_TEMPERATURE = 1e-5


def _show(value) -> str:
    """A value for an error message (an int past Python's 4300-digit str limit cannot be str'd)."""
    if isinstance(value, int) and abs(value) >= 10**30:
        return f"a {value.bit_length()}-bit integer"
    return repr(value)[:60]


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"{name} must be a number, got {type(value).__name__}", name)
    try:
        number = float(value)
    except OverflowError:
        raise RequestError(f"{name} is out of range, got {_show(value)}", name) from None
    if not math.isfinite(number):
        raise RequestError(f"{name} must be a finite number, got {number}", name)
    return number


def _integer(name: str, value) -> int:
    if isinstance(value, bool):  # an int to Python, never meant as one
        raise RequestError(f"{name} must be an integer, got bool", name)
    try:
        return operator.index(value)
    except TypeError:
        raise RequestError(f"{name} must be an integer, got {type(value).__name__}", name) from None


def _bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise RequestError(f"{name} must be true or false, got {type(value).__name__}", name)
    return value


def _within(name: str, value, lo=None, hi=None, *, above: bool = False):
    """`lo <= value <= hi` (`lo < value` when `above`); either bound may be None."""
    low_ok = lo is None or (value > lo if above else value >= lo)
    if not (low_ok and (hi is None or value <= hi)):
        left = "(" if above else "["
        bounds = f"{left}{lo}, {hi}]" if hi is not None else None
        want = f"in {bounds}" if bounds else f"{'>' if above else '>='} {lo}"
        raise RequestError(f"{name} must be {want}, got {_show(value)}", name)
    return value


MAX_LOGIT_BIAS_ENTRIES = 1024


def check_logit_bias(bias) -> dict[int, float] | None:
    """`{token id: bias}` with int keys (JSON's string keys converted), biases in [-100, 100];
    None or empty: no bias. Ids are checked against a vocabulary by the engine."""
    if bias is None or bias == {}:
        return None
    if not isinstance(bias, dict):
        raise RequestError(
            f"logit_bias must be an object mapping token ids to numbers, got {type(bias).__name__}", "logit_bias"
        )
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise RequestError(f"logit_bias has more than {MAX_LOGIT_BIAS_ENTRIES} entries", "logit_bias")
    out: dict[int, float] = {}
    for key, value in bias.items():
        token = key
        if isinstance(key, str):
            if not (key.isascii() and key.isdigit()) or len(key) > 12:
                raise RequestError(f"logit_bias keys must be token ids, got {_show(key)}", "logit_bias")
            token = int(key)
        token = _within("logit_bias", _integer("logit_bias", token), 0)
        out[token] = _within("logit_bias", _real("logit_bias", value), -LOGIT_BIAS_MAX, LOGIT_BIAS_MAX)
    return out


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # top-N logprobs per generated token (the sampled one is always included)
    skip_special_tokens: bool = True
    # Structured output: what the output must match (structured.py), None for free text.
    grammar: dict | None = None
    # Samples of the prompt (parallel_sampling.py): they share its KV blocks; sample i draws
    # with seed + i when seeded.
    n: int = 1
    # token id -> added to its logit before sampling (OpenAI's logit_bias); keys may be the
    # JSON form's strings. The engine checks the ids against its vocabulary.
    logit_bias: dict[int, float] | None = None

    def __post_init__(self) -> None:
        self.temperature = _within("temperature", _real("temperature", self.temperature), 0)
        self.top_p = _within("top_p", _real("top_p", self.top_p), 0, 1, above=True)
        self.top_k = -1 if self.top_k is None else _integer("top_k", self.top_k)
        if self.top_k == 0:
            self.top_k = -1
        _within("top_k", self.top_k, -1)
        self.min_p = _within("min_p", _real("min_p", self.min_p), 0, 1)
        for name in ("presence_penalty", "frequency_penalty"):
            setattr(self, name, _within(name, _real(name, getattr(self, name)), -2, 2))
        self.repetition_penalty = _within(
            "repetition_penalty", _real("repetition_penalty", self.repetition_penalty), 0, above=True
        )
        if self.seed is not None:
            self.seed = _within("seed", _integer("seed", self.seed), 0, SEED_MAX)
        if self.max_tokens is not None:
            self.max_tokens = _within("max_tokens", _integer("max_tokens", self.max_tokens), 1)
        if self.logprobs is not None:
            self.logprobs = _within("logprobs", _integer("logprobs", self.logprobs), 0, MAX_LOGPROBS)
        self.stop = self._stop_strings(self.stop)
        ids = self.stop_token_ids or []
        if not isinstance(ids, (list, tuple)):
            raise RequestError(f"stop_token_ids must be a list of integers, got {type(ids).__name__}", "stop_token_ids")
        self.stop_token_ids = [_within("stop_token_ids", _integer("stop_token_ids", t), 0) for t in ids]
        self.ignore_eos = _bool("ignore_eos", self.ignore_eos)
        self.skip_special_tokens = _bool("skip_special_tokens", self.skip_special_tokens)
        if self.grammar is not None:
            self.grammar = check_grammar(self.grammar)
        self.n = _within("n", _integer("n", self.n), 1, MAX_N)
        if self.seed is not None and self.seed + self.n - 1 > SEED_MAX:
            raise RequestError(f"seed + n - 1 must be at most {SEED_MAX} (sample i draws with seed + i)", "seed")
        self.logit_bias = check_logit_bias(self.logit_bias)

    @classmethod
    def from_wire(cls, wire: WireSamplingParams) -> SamplingParams:
        """The parameters a request carried (workers.protocol.replica), checked like any: the
        wire's names are this class's."""
        return cls(**wire.to_wire())

    @staticmethod
    def _stop_strings(stop) -> list[str]:
        if stop is None or isinstance(stop, str):
            stop = [stop] if stop else []
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise RequestError("stop must be a string or a list of strings", "stop")
        return [s for s in stop if s]

    @property
    def max_stop_len(self) -> int:
        return max((len(s) for s in self.stop), default=0)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1.0
