"""Quantized copies of a dense checkpoint, in the layouts real models ship, for the tests
(tests/engine/test_quantized.py) and `python -m workers.bench quant`.

`write_quantized(src, dst, twin, quant)` reads a dense Hugging Face directory (one or more
safetensors files) and writes two directories:
- `dst`: the quantized checkpoint (config.json with its `quantization_config`, safetensors with
  compressed-tensors pack-quantized int4 tensors or DeepSeek-V3 fp8 block tensors);
- `twin`: a dense fp32 checkpoint whose weights are exactly what `dst` dequantizes to.

Both are written by this file's own quantizers (not compressed-tensors' or DeepSeek's code), to
the conventions documented in docs/engine.md: int4 symmetric, scale = max|w| / 7.5 per group,
stored as q + 8 with the first value in the low bits of each int32; fp8 e4m3 with
scale_inv = max|w| / 448 per block.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from workers.engine.kernels.quant_matmul import dequantize_fp8_block, dequantize_int4, pack_int4
from workers.protocol.quantization import quantization_config

FP8_MAX = 448.0


def quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w fp32 [out, in] → (weight_packed int32, weight_scale bf16 [out, ceil(in/g)])."""
    rows, cols = w.shape
    pad = -cols % group_size
    groups = torch.nn.functional.pad(w, (0, pad)).view(rows, -1, group_size)
    scale = (groups.abs().amax(dim=-1) / 7.5).clamp_min(1e-8).to(torch.bfloat16)
    s = scale.float().repeat_interleave(group_size, dim=1)[:, :cols]
    q = torch.clamp(torch.round(w / s), -8, 7).to(torch.int8)
    return pack_int4(q), scale


def quantize_fp8_block(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """w fp32 [out, in] → (weight float8_e4m3fn, weight_scale_inv float32 per block)."""
    rows, cols = w.shape
    bn, bk = block
    padded = torch.nn.functional.pad(w, (0, -cols % bk, 0, -rows % bn))
    blocks = padded.view(padded.shape[0] // bn, bn, padded.shape[1] // bk, bk)
    scale_inv = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp_min(1e-12).float()
    s = scale_inv.repeat_interleave(bn, 0)[:rows].repeat_interleave(bk, 1)[:, :cols]
    return (w / s).to(torch.float8_e4m3fn), scale_inv


def int4_config(group_size: int = 32, ignore=("lm_head",), targets=("Linear",), **weights) -> dict:
    """A compressed-tensors config as Kimi K2 Thinking ships it (one group, W4A16)."""
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "kv_cache_scheme": None,
        "ignore": list(ignore),
        "config_groups": {
            "group_0": {
                "targets": list(targets),
                "input_activations": None,
                "output_activations": None,
                "weights": {
                    "num_bits": 4,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": group_size,
                    "dynamic": False,
                    "actorder": None,
                    "observer": "minmax",
                    **weights,
                },
            }
        },
    }


def fp8_config(block=(128, 128)) -> dict:
    """DeepSeek-V3's quantization_config."""
    return {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": list(block)}


def _is_linear(name: str) -> bool:
    """A linear layer's weight (DeepSeek-V3's router, `mlp.gate.weight`, stays dense as it ships)."""
    return name.endswith(("_proj.weight", ".kv_a_proj_with_mqa.weight")) or name == "lm_head.weight"


def write_quantized(src: Path, dst: Path, twin: Path, quant: dict) -> tuple[Path, Path]:
    config = json.loads((src / "config.json").read_text())
    scheme_of = quantization_config({"quantization_config": quant}).scheme_for
    tensors = {}
    for path in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    packed, dense = {}, {}
    for name, w in tensors.items():
        module = name.removesuffix(".weight")
        scheme = scheme_of(module) if _is_linear(name) else None
        if scheme is None:
            packed[name] = dense[name] = w
        elif scheme.kind == "int4":
            wp, scale = quantize_int4(w.float(), scheme.group_size)
            packed[f"{module}.weight_packed"] = wp
            packed[f"{module}.weight_scale"] = scale
            packed[f"{module}.weight_shape"] = torch.tensor(list(w.shape), dtype=torch.int64)
            dense[name] = dequantize_int4(wp, scale, scheme.group_size, w.shape[1], torch.float32)
        else:
            w8, scale_inv = quantize_fp8_block(w.float(), scheme.block)
            packed[name] = w8
            packed[f"{module}.weight_scale_inv"] = scale_inv
            dense[name] = dequantize_fp8_block(w8, scale_inv, scheme.block, torch.float32)
    for directory, weights, cfg in (
        (dst, packed, {**config, "quantization_config": quant}),
        (twin, dense, config),
    ):
        directory.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in weights.items()}, str(directory / "model.safetensors"))
        (directory / "config.json").write_text(json.dumps(cfg, indent=2))
        for extra in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            if (src / extra).is_file():
                shutil.copy(src / extra, directory / extra)
    return dst, twin
