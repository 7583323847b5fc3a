"""Inspect a Hugging Face model directory without importing torch (the web process stays light).

The directory layout (config.json, supported architecture, weight files) is checked by
`workers.protocol.model_files`, the same code the engine loads with; here we add the safetensors
headers (for the parameter count), the quantization format (workers.protocol.quantization), the
tokenizer check, the checksum, and the model roots a directory must be under (MODEL_ROOTS). An
EAGLE-3 draft head registers too (checked whole by `workers.protocol.draft_models`; it has no
tokenizer of its own): it is a deployment's `draft_model`, never a model served on its own.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

from workers.protocol.draft_models import EAGLE3_ARCHITECTURES, is_eagle3, read_eagle3, safetensors_header
from workers.protocol.model_files import (
    ModelDirectoryError,
    UnsupportedArchitectureError,
    architecture,
    local_files,
    model_file,
    read_config,
    weight_files,
)
from workers.protocol.quantization import check_loadable


@dataclass
class ModelInfo:
    architecture: str
    parameter_count: int
    dtype: str
    bytes_on_disk: int
    context_length: int | None
    weight_files: list[Path]


# Quantized checkpoints: scales and shapes are not parameters; an int32 of packed int4 holds 8.
_NOT_PARAMETERS = (".weight_scale", ".weight_scale_inv", ".weight_shape")


def _safetensors_params(path: Path) -> int:
    total = 0
    for name, meta in safetensors_header(path).items():
        if not name.endswith(_NOT_PARAMETERS):
            total += math.prod(meta.get("shape", [])) * (8 if name.endswith(".weight_packed") else 1)
    return total


def check_under_roots(source: str, roots: list[str]) -> Path:
    """`source`, symlinks resolved, if it is under one of `roots`. Checked before anything is
    read, and answered the same whether or not the path exists, so the API cannot be used to
    probe the filesystem outside the roots."""
    path = Path(source)
    if not path.is_absolute():
        raise ModelDirectoryError(f"{source!r} is not an absolute path")
    resolved = path.resolve()
    if any(resolved.is_relative_to(Path(root).expanduser().resolve()) for root in roots):
        return resolved  # what was checked is what is read
    allowed = ", ".join(roots) or "none are configured"
    raise ModelDirectoryError(f"{source} is not under a model root (MODEL_ROOTS: {allowed})")


def inspect_directory(directory: str | Path) -> ModelInfo:
    root = Path(directory)
    if not root.is_dir():
        raise ModelDirectoryError(f"{root} is not a directory on this machine")
    config = read_config(root)
    if is_eagle3(config):
        read_eagle3(root)  # its config and tensors agree; whether it fits a target is the deployment's check
        arch = config["architectures"][0]
    else:
        try:
            arch = architecture(config)
        except UnsupportedArchitectureError as exc:
            raise UnsupportedArchitectureError(
                f"{exc}; EAGLE-3 draft heads ({', '.join(EAGLE3_ARCHITECTURES)}) register as drafts"
            ) from None
        check_loadable(config, str(root / "config.json"))  # a format the engine cannot load is refused now
        if not model_file(root, "tokenizer.json").is_file():
            raise ModelDirectoryError(f"{root} has no tokenizer.json")
    files = weight_files(root)
    return ModelInfo(
        architecture=arch,
        parameter_count=sum(_safetensors_params(f) for f in files),
        dtype=str(config.get("torch_dtype") or config.get("dtype") or "float32"),
        bytes_on_disk=sum(p.stat().st_size for p in local_files(root)),
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
