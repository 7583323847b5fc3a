"""Speculative decoding: drafters guess a few tokens, the target verifies them in one pass.

`config` (speculative_config), `drafter` (the interface), `ngram` (prompt lookup), `eagle3`
(a draft head over the target's hidden states), `auto` (prompt lookup where the context repeats,
the head elsewhere), `cost_model` (k per sequence and step from measured costs), `rejection` (lossless verification),
`backoff` (sequences whose drafts keep failing pause), `stats` (counters), `speculator` (all of
it as the engine loop sees it, or nothing when speculation is off); the scheduler and model
runner carry the drafts through one forward pass.
"""

from workers.engine.errors import RequestError
from workers.engine.speculative.auto import AutoDrafter
from workers.engine.speculative.backoff import DraftBackoff
from workers.engine.speculative.config import SpeculativeConfig
from workers.engine.speculative.drafter import Drafter
from workers.engine.speculative.ngram import NgramDrafter
from workers.engine.speculative.speculator import NoSpeculation, Speculator
from workers.engine.speculative.stats import SpeculationStats


def make_drafter(
    config: SpeculativeConfig, target=None, target_config: dict | None = None, device=None, dtype=None
) -> Drafter:
    """The drafter for `config`. EAGLE-3 needs the target (model, config.json, device, dtype):
    its head is loaded, checked against the target, whose embedding it shares unless it has its
    own, and the target is told which layers' states to keep."""
    ngram = NgramDrafter(config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max)
    if config.method == "ngram":
        return ngram
    if config.method == "auto" and config.model is None:
        return AutoDrafter(ngram, None)
    if not hasattr(target, "capture_aux_hidden_states"):  # its forward keeps no aux states (models/aux_states.py)
        raise RequestError(
            f"EAGLE-3 drafting is not built for {target.config.architecture}; use speculative method 'ngram'"
        )
    from workers.engine.speculative.eagle3 import Eagle3Drafter, load_eagle3

    head = load_eagle3(config.model, target_config, target.draft_embedding, device, dtype)
    layers = head.spec.aux_layers(target.config.num_layers)
    target.capture_aux_hidden_states(layers)
    eagle3 = Eagle3Drafter(head, config.num_speculative_tokens, layers)
    return AutoDrafter(ngram, eagle3) if config.method == "auto" else eagle3


def make_speculator(
    config: SpeculativeConfig | None, target=None, target_config: dict | None = None, device=None, dtype=None
) -> Speculator | NoSpeculation:
    """The engine loop's speculator: `config`'s drafter behind a Speculator, or NoSpeculation."""
    if config is None:
        return NoSpeculation()
    return Speculator(config, make_drafter(config, target, target_config, device, dtype))


__all__ = [
    "AutoDrafter",
    "DraftBackoff",
    "Drafter",
    "NgramDrafter",
    "NoSpeculation",
    "SpeculationStats",
    "SpeculativeConfig",
    "Speculator",
    "make_drafter",
    "make_speculator",
]
