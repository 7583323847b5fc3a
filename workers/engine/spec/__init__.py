"""Speculative decoding: drafters guess a few tokens, the target verifies them in one pass.

`config` (speculative_config), `drafter` (the interface), `ngram` (prompt lookup),
`rejection` (lossless verification), `stats` (counters). The engine wires them together
(llm_engine.py); the scheduler and model runner carry the drafts through one forward pass.
"""

from workers.engine.spec.config import SpeculativeConfig
from workers.engine.spec.drafter import Drafter
from workers.engine.spec.ngram import NgramDrafter
from workers.engine.spec.stats import SpecStats


def make_drafter(config: SpeculativeConfig) -> Drafter:
    if config.method == "ngram":
        return NgramDrafter(config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max)
    raise ValueError(f"no drafter for method {config.method!r}")  # SpeculativeConfig refused it already


__all__ = ["Drafter", "NgramDrafter", "SpecStats", "SpeculativeConfig", "make_drafter"]
