"""The files of a Hugging Face model directory, read without torch.

Shared by the engine's loader and the control plane's catalog and gateway, which must not
import torch: which architectures are served (architectures.py), how config.json is read, how
long a context the model serves, which weight files a directory holds, and that every file
read is inside the directory.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePath

from workers.protocol.architectures import SUPPORTED_ARCHITECTURES

__all__ = ["SUPPORTED_ARCHITECTURES"]  # re-exported: its importers read it here


class ModelDirectoryError(ValueError):
    """A model directory is missing, broken, or of an unsupported architecture."""


class UnsupportedArchitectureError(ModelDirectoryError):
    pass


def model_file(model_dir: str | Path, name: str) -> Path:
    """The file `name` (relative: a fixed name, or an entry of a config or index) of the model
    directory, symlinks resolved. Refused when it is absolute, climbs with `..`, or resolves
    outside the directory: a model's files must not make us read others. The message is the
    same whether or not the outside target exists, so it reveals nothing about the filesystem."""
    root = Path(model_dir).resolve()
    relative = PurePath(name)
    if name.strip() and "\0" not in name and not relative.is_absolute() and ".." not in relative.parts:
        path = (root / relative).resolve()
        if path.is_relative_to(root):
            return path
    raise ModelDirectoryError(f"{model_dir}: {name!r} is outside the model directory")


def local_files(model_dir: str | Path) -> list[Path]:
    """The regular files directly in the model directory, without symlinks that lead out of it."""
    root = Path(model_dir).resolve()
    return [p for p in root.iterdir() if p.resolve().is_relative_to(root) and p.is_file()]


def read_config(model_dir: str | Path) -> dict:
    path = model_file(model_dir, "config.json")
    if not path.is_file():
        raise ModelDirectoryError(f"{model_dir}: no config.json (not a Hugging Face model directory)")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelDirectoryError(f"{path}: invalid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ModelDirectoryError(f"{path}: not a JSON object")
    return config


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


def sliding_window(config: dict) -> int | None:
    """The attention window of a model that uses one: Mistral's unless its config says
    otherwise; Qwen2's only with use_sliding_window."""
    if config.get("use_sliding_window", config.get("model_type", "") == "mistral"):
        return config.get("sliding_window")
    return None


def max_context(config: dict) -> int:
    """The longest context the engine serves this model exactly: its position embeddings, or
    within a sliding window (where full attention and windowed attention agree)."""
    positions = int(config.get("max_position_embeddings", 2048))
    window = sliding_window(config)
    return min(positions, window) if window else positions


def served_context(max_context: int, max_model_len: int | None) -> int:
    """The context a replica serves: the deployment's max_model_len when set, never past the
    model's. The gateway refuses a prompt by it before routing, the engine when admitting (an
    engine whose KV cache holds fewer tokens serves fewer still; only it knows)."""
    return min(max_model_len or max_context, max_context)


def weight_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files holding the weights: one file, or the shards an index names."""
    root = Path(model_dir)
    index = model_file(root, "model.safetensors.index.json")
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
            raise ModelDirectoryError(f"{index}: not a valid safetensors index ({exc})") from exc
        shards = weight_map.values() if isinstance(weight_map, dict) else [None]
        if not all(isinstance(name, str) for name in shards):
            raise ModelDirectoryError(f"{index}: not a valid safetensors index (weight_map: names to file names)")
        files = sorted({model_file(root, name) for name in shards})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelDirectoryError(f"{index} names shards that are missing: {', '.join(missing)}")
        return files
    single = model_file(root, "model.safetensors")
    if single.is_file():
        return [single]
    if list(root.glob("*.bin")):
        raise ModelDirectoryError(f"{root}: only PyTorch .bin weights found; convert them to safetensors")
    raise ModelDirectoryError(f"{root}: no model.safetensors or model.safetensors.index.json")
