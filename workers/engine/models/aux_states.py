"""The target's hidden states an EAGLE-3 head reads (speculative/eagle3.py): the residual stream after
chosen decoder layers, kept for every token a forward computes, side by side.

Both model families run their decoder layers through `run_layers` and mix in `AuxStates`."""

from __future__ import annotations

import torch

from workers.engine.errors import ModelLoadError


def run_layers(layers, x, rope, meta, aux_layer_ids: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x through every layer; and the outputs of the layers in `aux_layer_ids`, in the order
    named (a shallow model may name a layer twice), [tokens, n·hidden], or None when none are."""
    kept = {}
    for i, layer in enumerate(layers):
        x = layer(x, rope, meta)
        if i in aux_layer_ids:
            kept[i] = x
    return x, torch.cat([kept[i] for i in aux_layer_ids], dim=-1) if kept else None


def check_aux_layers(layer_ids: tuple[int, ...], num_layers: int) -> None:
    """ModelLoadError unless every id names one of the model's `num_layers` decoder layers."""
    bad = [i for i in layer_ids if not 0 <= i < num_layers]
    if bad:
        raise ModelLoadError(f"aux hidden state layers {bad} are not layers of this model")


class AuxStates:
    """What the engine asks of a target that feeds an EAGLE-3 head. The model's decoder stack
    (`self.model`) holds `aux_layer_ids` and sets `aux_hidden_states` in each forward."""

    def capture_aux_hidden_states(self, layer_ids: tuple[int, ...]) -> None:
        """From now on each forward keeps the outputs of these decoder layers (the residual
        stream after them) for every token, side by side: `aux_hidden_states` [tokens, n·hidden]."""
        check_aux_layers(layer_ids, self.config.num_layers)
        self.model.aux_layer_ids = tuple(layer_ids)

    @property
    def aux_hidden_states(self) -> torch.Tensor | None:
        return self.model.aux_hidden_states

    def draft_embedding(self) -> torch.nn.Embedding:
        """The embedding a head without its own shares (the target's)."""
        return self.model.embed_tokens
