"""`speculative_config`, in vLLM's spelling, checked once when the engine starts.

    LLM(model=..., speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                       "prompt_lookup_min": 1, "prompt_lookup_max": 4})

`disable_by_batch_size` (vLLM's name too): a step with more running sequences than this
verifies no drafts, because at that batch the extra query tokens cost more than the accepted
ones save (see docs/engine.md for the measurement behind the default).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from workers.engine.errors import RequestError

METHODS = ("ngram", "eagle3")
MAX_SPECULATIVE_TOKENS = 16
# Measured on the 2-core CPU (docs/engine.md): a verify step of k+1 tokens per sequence stays
# within ~1.4x of a plain decode step up to batch 4 and then grows with the batch, so beyond it
# the acceptance seen here (1.3-3 tokens a step) no longer pays.
DEFAULT_DISABLE_BY_BATCH_SIZE = 4


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    disable_by_batch_size: int = DEFAULT_DISABLE_BY_BATCH_SIZE

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
        if method == "eagle3":
            raise RequestError("speculative method 'eagle3' is not built yet; use 'ngram'")
        if method not in METHODS:
            raise RequestError(f"unknown speculative method {method!r}; choose one of {', '.join(METHODS)}")
        known = {f.name for f in fields(cls)} - {"method"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise RequestError(f"speculative_config: unknown keys {unknown} for method {method!r}")
        if "num_speculative_tokens" not in raw:
            raise RequestError("speculative_config needs num_speculative_tokens")
        values = {name: _positive_int(name, value) for name, value in raw.items()}
        config = cls(method=method, **values)
        if config.num_speculative_tokens > MAX_SPECULATIVE_TOKENS:
            raise RequestError(f"num_speculative_tokens must be at most {MAX_SPECULATIVE_TOKENS}")
        if config.prompt_lookup_min > config.prompt_lookup_max:
            raise RequestError(
                f"prompt_lookup_min ({config.prompt_lookup_min}) must not exceed prompt_lookup_max "
                f"({config.prompt_lookup_max})"
            )
        return config


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(f"speculative_config {name} must be a positive integer, got {value!r}")
    return value
