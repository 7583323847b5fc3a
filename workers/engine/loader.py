"""Load a Hugging Face model directory: config, safetensors weights (single file or sharded
index, memory-mapped, copied once into the model's parameters), generation config.

A quantized checkpoint needs nothing here: `ModelConfig.quantization` (read from config.json's
`quantization_config`) makes the model build int4 / fp8 layers where the checkpoint has them
(layers/quantized.py), and those copy the packed tensors in as they are."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from workers.engine.config import ModelConfig
from workers.engine.errors import ModelLoadError
from workers.engine.models import model_class
from workers.protocol.model_files import model_file, weight_files


def iter_tensors(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) from each file in turn; tensors are views of the mapped file. The
    files are those `weight_files` names: an index entry leading out of the directory is refused."""
    for path in weight_files(model_dir):
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
                    yield name, f.get_tensor(name)
        except ModelLoadError:
            raise
        except Exception as exc:  # safetensors raises its own SafetensorError for corrupt files
            raise ModelLoadError(f"{path}: cannot read safetensors ({exc})") from exc


def read_tensor(model_dir: str | Path, name: str) -> torch.Tensor | None:
    """One tensor of the checkpoint, read alone (None when no file holds it); errors as
    `iter_tensors`."""
    for path in weight_files(model_dir):
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                if name in f.keys():  # noqa: SIM118 - safe_open is not iterable
                    return f.get_tensor(name)
        except Exception as exc:  # safetensors raises its own SafetensorError for corrupt files
            raise ModelLoadError(f"{path}: cannot read safetensors ({exc})") from exc
    return None


def weights_identity(model_dir: str | Path, sample_bytes: int = 1 << 16) -> str:
    """A short name for these exact weights, the same on every node: blake2b over config.json
    and, per weight file, its size, its safetensors header and samples of its data at its
    start, middle and end. Two fine-tunes of one architecture differ in it (their blocks must
    never be shared through a KV tier), and computing it reads a few hundred KiB, not the model."""
    h = hashlib.blake2b(digest_size=8)
    h.update(model_file(model_dir, "config.json").read_bytes())
    for path in weight_files(model_dir):
        size = path.stat().st_size
        h.update(f"{path.name}:{size}".encode())
        with path.open("rb") as f:
            header = int.from_bytes(f.read(8), "little") + 8
            for offset in (0, header, header + (size - header) // 2, max(size - sample_bytes, 0)):
                f.seek(offset)
                h.update(f.read(sample_bytes if offset else min(header, 1 << 24)))
    return h.hexdigest()


def eos_token_ids(model_dir: str | Path, cfg: ModelConfig) -> tuple[int, ...]:
    path = model_file(model_dir, "generation_config.json")
    ids = list(cfg.eos_token_ids)
    if path.is_file():
        try:
            eos = json.loads(path.read_text()).get("eos_token_id")
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"{path}: invalid JSON ({exc})") from exc
        if isinstance(eos, int):
            eos = [eos]
        for e in eos or []:
            if e not in ids:
                ids.append(e)
    return tuple(ids)


def load_model(model_dir: str | Path, cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """Build the model on the meta device (no initialisation work), give it storage on
    `device`, then copy each checkpoint tensor into place once."""
    cls = model_class(cfg.architecture)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = cls(cfg)
    finally:
        torch.set_default_dtype(previous)
    model = model.materialize(device)
    model.load_weights(iter_tensors(model_dir))
    return model.eval()
