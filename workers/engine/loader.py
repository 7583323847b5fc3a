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
from workers.engine.layers.rotary import cos_sin_table
from workers.engine.models import model_class


def weight_files(model_dir: str | Path) -> list[Path]:
    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise ModelLoadError(f"{index}: not a valid safetensors index ({exc})") from exc
        files = sorted({root / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"{index} names shards that are missing: {', '.join(missing)}")
        return files
    single = root / "model.safetensors"
    if single.is_file():
        return [single]
    if list(root.glob("*.bin")):
        raise ModelLoadError(f"{root}: only PyTorch .bin weights found; convert them to safetensors")
    raise ModelLoadError(f"{root}: no model.safetensors or model.safetensors.index.json")


def iter_tensors(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) from each file in turn; tensors are views of the mapped file."""
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
    path = Path(model_dir) / "generation_config.json"
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


def load_model(model_dir: str | Path, device: torch.device, dtype: torch.dtype) -> tuple[torch.nn.Module, ModelConfig]:
    cfg = ModelConfig.from_dir(model_dir)
    cls = model_class(cfg.architecture)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = cls(cfg)
    finally:
        torch.set_default_dtype(previous)
    model = model.to_empty(device=device)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.cos_sin = cos_sin_table(cfg.head_dim, cfg.max_position_embeddings, cfg.rope).to(device)
    model.load_weights(iter_tensors(model_dir))
    model.eval()
    return model, cfg
