"""Inspect a Hugging Face model directory without importing torch (the web process stays light).

Reads config.json, the safetensors headers (for the parameter count), and checks for a
tokenizer. `SUPPORTED_ARCHITECTURES` mirrors the engine's registry; a test keeps them equal.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


class InvalidModelDirectory(ValueError):
    pass


@dataclass
class ModelInfo:
    architecture: str
    parameter_count: int
    dtype: str
    bytes_on_disk: int
    context_length: int | None
    weight_files: list[Path]


def _safetensors_params(path: Path) -> int:
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise InvalidModelDirectory(f"{path.name} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", raw)
        if length > 100 << 20:
            raise InvalidModelDirectory(f"{path.name} has an implausible header; the file is corrupt")
        try:
            header = json.loads(f.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidModelDirectory(f"{path.name} has an unreadable header ({exc})") from exc
    total = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for dim in meta.get("shape", []):
            count *= dim
        total += count
    return total


def inspect_directory(directory: str | Path) -> ModelInfo:
    root = Path(directory)
    if not root.is_dir():
        raise InvalidModelDirectory(f"{root} is not a directory on this machine")
    config_path = root / "config.json"
    if not config_path.is_file():
        raise InvalidModelDirectory(f"{root} has no config.json; is it a Hugging Face model directory?")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise InvalidModelDirectory(f"config.json is not valid JSON ({exc})") from exc
    archs = config.get("architectures") or []
    arch = archs[0] if archs else ""
    if arch not in SUPPORTED_ARCHITECTURES:
        raise InvalidModelDirectory(
            f"architecture {arch or '(none)'!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as exc:
            raise InvalidModelDirectory(f"model.safetensors.index.json is invalid ({exc})") from exc
        files = [root / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise InvalidModelDirectory(f"weight shards missing: {', '.join(missing)}")
    elif (root / "model.safetensors").is_file():
        files = [root / "model.safetensors"]
    else:
        raise InvalidModelDirectory(f"{root} has no model.safetensors (or sharded index); only safetensors is served")
    if not (root / "tokenizer.json").is_file():
        raise InvalidModelDirectory(f"{root} has no tokenizer.json")
    return ModelInfo(
        architecture=arch,
        parameter_count=sum(_safetensors_params(f) for f in files),
        dtype=str(config.get("torch_dtype") or config.get("dtype") or "float32"),
        bytes_on_disk=sum(p.stat().st_size for p in root.iterdir() if p.is_file()),
        context_length=config.get("max_position_embeddings"),
        weight_files=files,
    )


def checksum(files: list[Path], chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    for path in files:
        with path.open("rb") as f:
            while block := f.read(chunk):
                digest.update(block)
    return digest.hexdigest()
