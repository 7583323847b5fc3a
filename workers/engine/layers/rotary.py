"""Rotary embedding tables: the inverse frequencies (default, llama3- or yarn-scaled) and cos/sin.

YaRN follows transformers' `_compute_yarn_parameters` (DeepSeek-V3, Kimi K2): frequencies
ramp from extrapolated (fast dimensions) to interpolated by `factor` (slow ones) between the
correction dimensions of `beta_fast` and `beta_slow` rotations; cos/sin are scaled by the
attention factor, and DeepSeek's attention scales its softmax by mscale(factor, mscale_all_dim)².
"""

import math

import torch

from workers.engine.config import RopeConfig


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(rope: RopeConfig) -> float:
    """What cos and sin are multiplied by (1 for other rope kinds)."""
    if rope.kind != "yarn":
        return 1.0
    if rope.attention_factor is not None:
        return rope.attention_factor
    if rope.mscale and rope.mscale_all_dim:
        return _yarn_mscale(rope.factor, rope.mscale) / _yarn_mscale(rope.factor, rope.mscale_all_dim)
    return _yarn_mscale(rope.factor)


def yarn_softmax_scale(rope: RopeConfig, scale: float) -> float:
    """DeepSeek's softmax scale: `scale` · mscale(factor, mscale_all_dim)² under a scaled rope."""
    if rope.kind != "default" and rope.mscale_all_dim:
        m = _yarn_mscale(rope.factor, rope.mscale_all_dim)
        return scale * m * m
    return scale


def _yarn_inverse_frequencies(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    pos_freqs = rope.theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (rope.factor * pos_freqs)

    def correction_dim(rotations: float) -> float:
        return (head_dim * math.log(rope.original_max_position / (rotations * 2 * math.pi))) / (
            2 * math.log(rope.theta)
        )

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (fast dimensions), 0: interpolate
    return interpolation * (1 - keep) + extrapolation * keep


def inverse_frequencies(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    if rope.kind == "yarn":
        return _yarn_inverse_frequencies(head_dim, rope)
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
    table = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    factor = yarn_attention_factor(rope)
    return table if factor == 1.0 else table * factor
