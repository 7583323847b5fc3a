"""Rotary embedding tables: the inverse frequencies (default or llama3-scaled) and cos/sin."""

import math

import torch

from workers.engine.config import RopeConfig


def inverse_frequencies(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    inv = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.kind == "llama3":
        # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
        low_wavelen = rope.original_max_position / rope.low_freq_factor
        high_wavelen = rope.original_max_position / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
        smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        blended = (1 - smooth) * scaled / rope.factor + smooth * scaled
        in_band = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = torch.where(in_band, blended, scaled)
    return inv


def cos_sin_table(head_dim: int, max_positions: int, rope: RopeConfig) -> torch.Tensor:
    """[max_positions, head_dim] fp32: cos of each frequency, then sin (the kernels' layout)."""
    inv = inverse_frequencies(head_dim, rope)
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.int64).float(), inv)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)
