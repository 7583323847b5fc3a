"""The files of a Hugging Face model directory, read without torch.

Shared by the engine's loader and the control plane's catalog, which must not import torch:
one place decides which architectures are served, how config.json is read and which weight
files a directory holds.
"""

from __future__ import annotations

import json
from pathlib import Path

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


class ModelDirectoryError(ValueError):
    """A model directory is missing, broken, or of an unsupported architecture."""


class UnsupportedArchitectureError(ModelDirectoryError):
    pass


def read_config(model_dir: str | Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ModelDirectoryError(f"{model_dir}: no config.json (not a Hugging Face model directory)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelDirectoryError(f"{path}: invalid JSON ({exc})") from exc


def architecture(config: dict, source: str = "config.json") -> str:
    """The config's architecture, if the engine serves it."""
    archs = config.get("architectures") or []
    arch = archs[0] if archs else ""
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"{source}: architecture {arch or '(none)'!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return arch


def weight_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files holding the weights: one file, or the shards an index names."""
    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise ModelDirectoryError(f"{index}: not a valid safetensors index ({exc})") from exc
        files = sorted({root / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelDirectoryError(f"{index} names shards that are missing: {', '.join(missing)}")
        return files
    single = root / "model.safetensors"
    if single.is_file():
        return [single]
    if list(root.glob("*.bin")):
        raise ModelDirectoryError(f"{root}: only PyTorch .bin weights found; convert them to safetensors")
    raise ModelDirectoryError(f"{root}: no model.safetensors or model.safetensors.index.json")
