"""Load a Hugging Face model directory: config, safetensors weights (single file or sharded
index, memory-mapped, copied once into the model's parameters), generation config."""

from __future__ import annotations

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
