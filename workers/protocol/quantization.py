"""A checkpoint's `quantization_config`, read without torch: which weight formats are served,
and which linear layers (by checkpoint module name) hold which format.

Two formats load (docs/engine.md, "Quantized weights"):

- compressed-tensors `pack-quantized`, the layout Kimi K2 Thinking / K2.5 ship: symmetric int4
  weights in groups along the input dimension (`weight_packed` int32, eight values a word, the
  first in the low bits, each stored as value + 8), one scale per group (`weight_scale`), and
  `weight_shape`. `config_groups` name the layers by `targets`; `ignore` keeps some dense.
- `fp8` as DeepSeek-V3 ships it: `weight` float8 e4m3 and `weight_scale_inv` float32, one per
  `weight_block_size` block (128×128), dequantized as weight × scale_inv.

Anything else is refused here, by name, both when the control plane registers a model and when
the engine loads one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from workers.protocol.model_files import ModelDirectoryError


class UnsupportedQuantizationError(ModelDirectoryError):
    pass


@dataclass(frozen=True)
class WeightScheme:
    """How one linear layer's weight is stored."""

    kind: str  # "int4" (compressed-tensors pack-quantized) | "fp8" (block-scaled e4m3)
    group_size: int = 0  # int4: input columns per scale
    block: tuple[int, int] = (0, 0)  # fp8: (rows, columns) per scale


@dataclass(frozen=True)
class _Group:
    scheme: WeightScheme
    targets: tuple[str, ...]


@dataclass(frozen=True)
class QuantConfig:
    method: str  # "compressed-tensors" | "fp8"
    groups: tuple[_Group, ...]
    ignore: tuple[str, ...]

    def scheme_for(self, module: str) -> WeightScheme | None:
        """The scheme of the linear layer the checkpoint names `module` (e.g.
        "model.layers.0.mlp.down_proj"), or None where it stays dense. `ignore` wins; then the
        first group whose targets match. Every layer made by the factory is a "Linear"."""
        if any(_matches(pattern, module) for pattern in self.ignore):
            return None
        for group in self.groups:
            if any(t == "Linear" or _matches(t, module) for t in group.targets):
                return group.scheme
        return None

    @property
    def summary(self) -> str:
        kinds = sorted({g.scheme.kind for g in self.groups})
        return f"{self.method} ({', '.join(kinds)})"


def _matches(pattern: str, module: str) -> bool:
    # compressed-tensors' convention: "re:" marks a regular expression matched from the start of
    # the module name; anything else is a whole module name.
    if pattern.startswith("re:"):
        return re.match(pattern[3:], module) is not None
    return module == pattern


def _refuse(source: str, what: str) -> UnsupportedQuantizationError:
    return UnsupportedQuantizationError(
        f"{source}: quantization_config {what}; supported: compressed-tensors pack-quantized "
        "(int4, symmetric, group strategy, weight-only) and fp8 (e4m3, block scales)"
    )


def _int4_scheme(name: str, weights: dict, source: str) -> WeightScheme:
    def want(key, expected, value):
        if value != expected:
            raise _refuse(source, f"group {name!r} has weights.{key}={value!r} (only {expected!r} is built)")

    want("num_bits", 4, weights.get("num_bits"))
    want("type", "int", weights.get("type", "int"))
    want("symmetric", True, weights.get("symmetric"))
    want("strategy", "group", weights.get("strategy", "group"))
    want("dynamic", False, bool(weights.get("dynamic", False)))
    if weights.get("actorder") not in (None, False, "static"):
        # "group" activation order stores a permutation (weight_g_idx) this engine does not apply.
        raise _refuse(source, f"group {name!r} has weights.actorder={weights['actorder']!r}")
    group_size = weights.get("group_size")
    if not isinstance(group_size, int) or group_size <= 0:
        raise _refuse(source, f"group {name!r} has weights.group_size={group_size!r}")
    return WeightScheme("int4", group_size=group_size)


def _compressed_tensors(raw: dict, source: str) -> QuantConfig:
    fmt = raw.get("format")
    if fmt != "pack-quantized":
        raise _refuse(source, f"format {fmt!r} of compressed-tensors is not built")
    if raw.get("sparsity_config"):
        raise _refuse(source, "has a sparsity_config (sparse weights are not built)")
    if raw.get("kv_cache_scheme"):
        raise _refuse(source, "has a kv_cache_scheme (a quantized KV cache is not built)")
    groups = []
    for name, group in (raw.get("config_groups") or {}).items():
        if group.get("input_activations") or group.get("output_activations"):
            raise _refuse(source, f"group {name!r} quantizes activations (only weight-only is built)")
        if group.get("format") not in (None, "pack-quantized"):
            raise _refuse(source, f"group {name!r} has format {group['format']!r}")
        targets = tuple(group.get("targets") or ())
        if not targets:
            raise _refuse(source, f"group {name!r} has no targets")
        groups.append(_Group(_int4_scheme(name, group.get("weights") or {}, source), targets))
    if not groups:
        raise _refuse(source, "has no config_groups")
    return QuantConfig("compressed-tensors", tuple(groups), tuple(raw.get("ignore") or ()))


def _fp8(raw: dict, source: str) -> QuantConfig:
    fmt = raw.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise _refuse(source, f"fp8 fmt {fmt!r} is not built")
    if raw.get("activation_scheme", "dynamic") != "dynamic":
        # Static activation scales come as input_scale tensors this engine has no place for;
        # "dynamic" ones are computed at run time, and here activations stay in the model dtype.
        raise _refuse(source, f"fp8 activation_scheme {raw['activation_scheme']!r} is not built")
    block = raw.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise _refuse(source, f"fp8 weight_block_size {block!r} (per-tensor fp8 is not built)")
    scheme = WeightScheme("fp8", block=(block[0], block[1]))
    # DeepSeek-V3 names no targets: every linear layer is fp8 but the output head, plus the
    # layers a converter listed as left alone.
    ignore = ("lm_head", *(raw.get("modules_to_not_convert") or ()), *(raw.get("ignored_layers") or ()))
    return QuantConfig("fp8", (_Group(scheme, ("Linear",)),), ignore)


def check_loadable(config: dict, source: str = "config.json") -> None:
    """Refuse, by name, a quantized checkpoint the engine cannot load (at registration and load)."""
    quantization_config(config, source)  # an unknown format is refused here


def quantization_config(config: dict, source: str = "config.json") -> QuantConfig | None:
    """The parsed `quantization_config` of a config.json, None for a dense model."""
    raw = config.get("quantization_config")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _refuse(source, "is not an object")
    method = raw.get("quant_method")
    if method == "compressed-tensors":
        return _compressed_tensors(raw, source)
    if method == "fp8":
        return _fp8(raw, source)
    raise _refuse(source, f"quant_method {method!r} is not built")
