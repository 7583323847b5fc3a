"""`speculative_config`, in vLLM's spelling, checked once when the engine starts.

    LLM(model=..., speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                       "prompt_lookup_min": 2, "prompt_lookup_max": 4})
    LLM(model=..., speculative_config={"method": "eagle3", "model": DRAFT_DIR,
                                       "num_speculative_tokens": 3})
    LLM(model=..., speculative_config={"method": "auto", "num_speculative_tokens": 4,
                                       "model": DRAFT_DIR})  # the head optional (auto.py)

`disable_by_batch_size` (vLLM's name too): a step with more running sequences than this
verifies no drafts, because at that batch the extra query tokens cost more than the accepted
ones save (see docs/engine.md for the measurement behind the default). `draft_backoff`: after
this many draft runs in a row that accepted nothing, a sequence pauses drafting (1, 2, 4, ... up
to 16 steps; speculative/backoff.py); 0 never pauses. `choose_k`: "fixed" (default) drafts
`num_speculative_tokens` at every step within the batch threshold; "measured" chooses k per
sequence and step, 0 included, from the step, verify and draft times this engine measures and the
acceptance it sees (speculative/cost_model.py), with no batch threshold unless one is given.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from workers.engine.errors import RequestError

METHODS = ("ngram", "eagle3", "auto")
CHOOSE_K = ("fixed", "measured")
NO_BATCH_LIMIT = 1 << 30  # choose_k "measured" without a disable_by_batch_size: the costs decide
MAX_SPECULATIVE_TOKENS = 16
# Measured on the 2-core CPU (docs/engine.md, k = 3, every draft rejected): a verify step costs
# 1.26x a plain decode step at batch 1, 1.5x at 2, 1.85x at 4, 2.5x at 8 (demo model; SmolLM-135M's
# shape alike). n-gram runs on copy-heavy text yield ~2.5-3 tokens a draft, so speculation pays up
# to 4 running sequences and no longer at 8 (the tool-call workload ran 0.91x there). An EAGLE-3
# draft run costs ~0.8 of a demo-model decode step at batch 1 and grows with the batch (one
# batched pass per draft step, attention per sequence): with its demo head (acceptance length
# ~3.5) a mix of tool calls and chat ran 1.40x, 1.24x, 1.09x, 0.99x, 0.86x at batch 1, 2, 3, 4, 8
# with speculation forced on, so it stops above 3.
DEFAULT_DISABLE_BY_BATCH_SIZE = {"ngram": 4, "eagle3": 3}
# Two runs in a row that accept nothing: one can be bad luck; on the demo model's tool calls, where
# prompt lookup never matches what the answer says, every further run was rejected too.
DEFAULT_DRAFT_BACKOFF = 2


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    # 2: on the demo model's chat answers every 1-gram guess was rejected (pure cost), while
    # tool calls copied from the conversation ran as fast with 2 as with 1.
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    disable_by_batch_size: int = 0  # 0: the method's default (DEFAULT_DISABLE_BY_BATCH_SIZE)
    draft_backoff: int = DEFAULT_DRAFT_BACKOFF
    model: str | None = None  # eagle3: the draft head's directory
    choose_k: str = "fixed"

    @classmethod
    def from_dict(cls, raw: dict | SpeculativeConfig | None) -> SpeculativeConfig | None:
        """None (or {}) means no speculation; anything wrong is a RequestError naming it."""
        if raw is None or isinstance(raw, SpeculativeConfig):
            return raw
        if not isinstance(raw, dict):
            raise RequestError(f"speculative_config must be a dict, got {type(raw).__name__}")
        if not raw:
            return None
        raw = dict(raw)
        method = raw.pop("method", None)
        if method not in METHODS:
            raise RequestError(f"unknown speculative method {method!r}; choose one of {', '.join(METHODS)}")
        known = {f.name for f in fields(cls)} - {"method"}
        if method == "ngram":
            known -= {"model"}
        elif method == "eagle3":
            known -= {"prompt_lookup_min", "prompt_lookup_max"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise RequestError(f"speculative_config: unknown keys {unknown} for method {method!r}")
        if "num_speculative_tokens" not in raw:
            raise RequestError("speculative_config needs num_speculative_tokens")
        choose_k = raw.pop("choose_k", "measured" if method == "auto" else "fixed")
        if choose_k not in CHOOSE_K:
            raise RequestError(f"speculative_config choose_k must be one of {', '.join(CHOOSE_K)}, got {choose_k!r}")
        if method == "auto" and choose_k != "measured":
            raise RequestError("speculative method 'auto' chooses k from measured costs: choose_k must be 'measured'")
        model = raw.pop("model", None)
        if method == "eagle3" and (not isinstance(model, str) or not model):
            raise RequestError("speculative method 'eagle3' needs 'model': the EAGLE-3 head's directory")
        if method == "auto" and model is not None and (not isinstance(model, str) or not model):
            raise RequestError("speculative method 'auto' takes 'model' (an EAGLE-3 head's directory) or none")
        values = {name: _count(name, value, minimum=0 if name == "draft_backoff" else 1) for name, value in raw.items()}
        values.setdefault(
            "disable_by_batch_size", NO_BATCH_LIMIT if choose_k == "measured" else DEFAULT_DISABLE_BY_BATCH_SIZE[method]
        )
        config = cls(method=method, model=model, choose_k=choose_k, **values)
        if config.num_speculative_tokens > MAX_SPECULATIVE_TOKENS:
            raise RequestError(f"num_speculative_tokens must be at most {MAX_SPECULATIVE_TOKENS}")
        if config.prompt_lookup_min > config.prompt_lookup_max:
            raise RequestError(
                f"prompt_lookup_min ({config.prompt_lookup_min}) must not exceed prompt_lookup_max "
                f"({config.prompt_lookup_max})"
            )
        return config


def _count(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a non-negative" if minimum == 0 else "a positive"
        raise RequestError(f"speculative_config {name} must be {what} integer, got {value!r}")
    return value
