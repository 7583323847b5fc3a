"""One rank's part of a model: the decoder layers of its stage with its heads and MLP slice,
plus the vocab-parallel embedding (first stage) and LM head (last stage). Each tensor is read
from the safetensors files as the slice this rank holds (`get_slice`): no process ever
materialises a whole weight it does not keep.

`ShardedStage` holds what every family shares (embedding, head, loader); a family says where
each checkpoint tensor goes (`_layer_placements`): `LlamaStage` here (Llama, Mistral, Qwen2,
Qwen3), `DeepseekStage` in deepseek.py (MLA + MoE)."""

from __future__ import annotations

import dataclasses
import re

import torch
from safetensors import safe_open
from torch import nn

from workers.engine.config import ModelConfig
from workers.engine.errors import ModelLoadError
from workers.engine.layers.norm import RMSNorm
from workers.engine.layers.quantized import prepare_linears, quantized_tensor_layout
from workers.engine.layers.rotary import cos_sin_table
from workers.engine.loader import read_tensor
from workers.engine.meta_device import empty_on
from workers.engine.models.aux_states import check_aux_layers, run_layers
from workers.engine.models.llama import DecoderLayer
from workers.engine.parallel.group import RankGroup
from workers.engine.parallel.layers import (
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    head_range,
    kv_head_range,
    vocab_range,
)
from workers.protocol.model_files import weight_files


def rank_config(cfg: ModelConfig, group: RankGroup) -> ModelConfig:
    """The shapes this rank holds: its stage's layers, its heads, its MLP slice (the model
    runner sizes this rank's KV cache from it)."""
    tp = group.tp
    start, end = group.stage_bounds[group.stage]
    return dataclasses.replace(
        cfg,
        num_layers=end - start,
        num_heads=cfg.num_heads // tp,
        num_kv_heads=max(cfg.num_kv_heads // tp, 1),
        intermediate_size=cfg.intermediate_size // tp,
    )


# (parameter, index into it or None, source dim, source start, source end): where one checkpoint
# tensor goes on this rank; `None` for start/end reads it whole.
Placement = tuple[str, object, int, int | None, int | None]


_SWIGLU = re.compile(r"(mlp\.(?:shared_experts\.)?)(gate|up|down)_proj\.(weight|bias)")


def swiglu_placements(prefix: str, rest: str, tp_rank: int, widths: dict[str, int]) -> list[Placement] | None:
    """A SwiGLU MLP's tensor `rest` (e.g. "mlp.up_proj.weight"), or None if it is not one: gate
    and up go fused column-parallel (rank t's rows [t·w, (t+1)·w) of each into gate_up_proj),
    down row-parallel (its columns; a bias is added once, after the sum). `widths`: each MLP's
    per-rank width by its module path ("mlp.", "mlp.shared_experts.")."""
    m = _SWIGLU.fullmatch(rest)
    if m is None or m[1] not in widths:
        return None
    mlp, part, kind = m.groups()
    w, t = widths[mlp], tp_rank
    if part == "down":
        if kind == "bias":
            return [(prefix + rest, None, 0, None, None)]
        return [(prefix + rest, None, 1, t * w, (t + 1) * w)]
    dest = slice(0, w) if part == "gate" else slice(w, 2 * w)
    return [(f"{prefix}{mlp}gate_up_proj.{kind}", dest, 0, t * w, (t + 1) * w)]


class ShardedStage(nn.Module):
    """A stage's embedding (first stage), final norm and LM head (last stage), the three parts
    the parallel runner calls, and the loader; subclasses build `self.layers` and place each
    layer tensor (`_layer_placements`)."""

    def __init__(self, cfg: ModelConfig, group: RankGroup, local: ModelConfig):
        super().__init__()
        self.config, self.group, self.local = cfg, group, local
        self.layer_start = group.stage_bounds[group.stage][0]
        self.embed_tokens = (
            VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, group) if group.is_first_stage else None
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if group.is_last_stage else None
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, group) if group.is_last_stage else None
        self._tie()
        self.register_buffer("cos_sin", torch.empty(0), persistent=False)
        # The layers whose outputs an EAGLE-3 head on rank 0 reads (`aux_layers`, the model's
        # numbering) and which of them are this stage's (`aux_layer_ids`, numbered in the stage).
        # The residual stream is whole on every tensor-parallel rank after each layer (its sums
        # are all-reduced); the runner brings other stages' parts to rank 0.
        self.aux_layers: tuple[int, ...] = ()
        self.aux_layer_ids: tuple[int, ...] = ()
        self.aux_hidden_states: torch.Tensor | None = None
        self.model_dir = None  # where the weights came from (load_from)
        self._draft_embedding: torch.Tensor | None = None  # the whole table, read once (draft_embedding)

    def _tie(self) -> None:
        if self.config.tie_word_embeddings and self.embed_tokens is not None and self.lm_head is not None:
            self.lm_head.weight = self.embed_tokens.weight

    @classmethod
    def load(cls, model_dir, cfg: ModelConfig, group: RankGroup, dtype: torch.dtype) -> ShardedStage:
        """This rank's stage: built on the meta device, given storage, filled from the files."""
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device("meta"):
                model = cls(cfg, group)
        finally:
            torch.set_default_dtype(previous)
        model = model.materialize(group.device)
        model.load_from(model_dir)
        return model.eval()

    def rope_dim(self) -> int:
        return self.config.head_dim

    def materialize(self, device: torch.device) -> ShardedStage:
        model = empty_on(self, device)
        model._tie()
        cfg = self.config
        model.cos_sin = cos_sin_table(self.rope_dim(), cfg.max_position_embeddings, cfg.rope).to(device)
        return model

    # -- the three parts a stage runs ------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def decode_layers(self, x: torch.Tensor, positions: torch.Tensor, meta, keep_aux: bool = True) -> torch.Tensor:
        rope = self.cos_sin.index_select(0, positions)
        x, self.aux_hidden_states = run_layers(self.layers, x, rope, meta, self.aux_layer_ids if keep_aux else ())
        return x

    # -- what an EAGLE-3 drafter on rank 0 needs (speculative/__init__.py) ------------------------------
    def capture_aux_hidden_states(self, layer_ids: tuple[int, ...]) -> None:
        """As models/aux_states.py, on every rank: a stage's first rank keeps the outputs of
        those of the layers its stage holds (`aux_hidden_states`, in the order named); the
        other ranks of the stage have the same ones and keep none."""
        check_aux_layers(layer_ids, self.config.num_layers)
        self.aux_layers = tuple(layer_ids)
        start = self.group.stage_bounds[self.group.stage][0]
        if self.group.tp_rank == 0:
            self.aux_layer_ids = tuple(i - start for i in self.stage_aux_layers(self.group.stage))

    def stage_aux_layers(self, stage: int) -> list[int]:
        """The aux layers `stage` holds, in the order named (model numbering)."""
        start, end = self.group.stage_bounds[stage]
        return [i for i in self.aux_layers if start <= i < end]

    def draft_embedding(self) -> nn.Embedding:
        """The whole embedding, for a head that shares it (rank 0, the first stage). Without
        tensor parallelism this rank holds it; otherwise only its vocabulary rows, so the table
        is read from the checkpoint, once (`build_rank` reads it before sizing the KV cache)."""
        if self._draft_embedding is None:
            if self.group.tp == 1:
                self._draft_embedding = self.embed_tokens.weight.detach()[: self.config.vocab_size]
            else:
                weight = read_tensor(self.model_dir, "model.embed_tokens.weight")
                if weight is None:
                    raise ModelLoadError(
                        "the checkpoint has no model.embed_tokens.weight for the EAGLE-3 head to share"
                    )
                self._draft_embedding = weight.to(self.embed_tokens.weight)
        return nn.Embedding.from_pretrained(self._draft_embedding, freeze=True)

    def logits(self, x: torch.Tensor, logits_indices: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x.index_select(0, logits_indices))).float()

    # -- loading -----------------------------------------------------------------------------
    def _placements(self, name: str) -> list[Placement] | None:
        """Where checkpoint tensor `name` goes on this rank ([] when this rank does not hold
        it), or None when it has no place in the model at all."""
        cfg, g = self.config, self.group
        v_start, v_held, _ = vocab_range(cfg.vocab_size, g.tp, g.tp_rank)
        rows = slice(0, v_held)
        if name == "model.embed_tokens.weight":
            out = []
            if self.embed_tokens is not None:
                out.append(("embed_tokens.weight", rows, 0, v_start, v_start + v_held))
            if cfg.tie_word_embeddings and self.lm_head is not None and self.embed_tokens is None:
                out.append(("lm_head.weight", rows, 0, v_start, v_start + v_held))
            return out
        if name == "lm_head.weight":
            if cfg.tie_word_embeddings or self.lm_head is None:
                return []
            return [("lm_head.weight", rows, 0, v_start, v_start + v_held)]
        if name == "model.norm.weight":
            return [("norm.weight", None, 0, None, None)] if self.norm is not None else []
        if not name.startswith("model.layers."):
            return None
        index, rest = name.removeprefix("model.layers.").split(".", 1)
        i = int(index) - self.layer_start
        if not 0 <= i < self.local.num_layers:
            return []  # another stage's layer (or a multi-token-prediction layer past the last)
        return self._layer_placements(f"layers.{i}.", rest)

    def _layer_placements(self, prefix: str, rest: str) -> list[Placement] | None:
        """Tensor `model.layers.<i>.<rest>` of a layer this stage holds as `<prefix><rest>`."""
        raise NotImplementedError

    def _checkpoint_targets(self) -> dict[str, torch.Tensor]:
        """What the loader fills: every parameter and persistent buffer."""
        persistent = set(self.state_dict())
        return dict(self.named_parameters(remove_duplicate=False)) | {
            name: b for name, b in self.named_buffers() if name in persistent
        }

    def _after_load(self) -> None:
        prepare_linears(self)

    @torch.no_grad()
    def load_from(self, model_dir) -> None:
        """Every tensor this rank holds from the checkpoint, or a ModelLoadError naming what is
        missing: each parameter must be written whole (counted in elements, so one expert or one
        of gate/up cannot pass for the stacked tensor) and each quantized layer's every tensor."""
        self.model_dir = model_dir
        params = self._checkpoint_targets()
        quantized = quantized_tensor_layout(self)  # whole layers: the routed experts a rank holds
        in_quantized = {id(t) for layer, _, _ in quantized.values() for t in layer.buffers()}
        written: dict[int, int] = {}  # id(parameter) → elements written
        loaded: set[str] = set()  # quantized tensors read
        for path in weight_files(model_dir):
            try:
                handle = safe_open(str(path), framework="pt", device="cpu")
            except Exception as exc:
                raise ModelLoadError(f"{path}: cannot read safetensors ({exc})") from exc
            with handle as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
                    if "rotary_emb.inv_freq" in name:
                        continue
                    if name in quantized:
                        layer, suffix, rows = quantized[name]
                        layer.load_tensor(name, suffix, f.get_tensor(name), rows)
                        loaded.add(name)
                        continue
                    places = self._placements(name)
                    if places is None or any(p[0] not in params for p in places):
                        raise ModelLoadError(f"checkpoint tensor {name!r} has no place in {self.config.architecture}")
                    for target, index, dim, a, b in places:
                        sl = f.get_slice(name)
                        if a is None:
                            src = sl[:]
                        elif dim == 0:
                            src = sl[a:b]
                        else:
                            src = sl[:, a:b]
                        dest = params[target].data
                        if index is not None:
                            dest = dest[index]
                        if dest.shape != src.shape:
                            raise ModelLoadError(
                                f"checkpoint tensor {name!r}: slice of shape {tuple(src.shape)} does not fit "
                                f"{target} {tuple(dest.shape)}"
                            )
                        dest.copy_(src)
                        key = id(params[target])
                        written[key] = written.get(key, 0) + dest.numel()
        _, held, per = vocab_range(self.config.vocab_size, self.group.tp, self.group.tp_rank)
        missing = sorted(set(quantized) - loaded)
        for name, p in params.items():
            if id(p) in in_quantized:
                continue
            vocab = name in ("embed_tokens.weight", "lm_head.weight")
            whole = held * p.shape[1] if vocab else p.numel()  # the last vocabulary shard is padded
            if written.get(id(p), 0) < whole:
                missing.append(name)
            if vocab and held < per:
                p.data[held:].zero_()
        if missing:
            raise ModelLoadError(f"checkpoint is missing tensors for: {', '.join(missing[:8])}")
        self._after_load()


class LlamaStage(ShardedStage):
    """Llama, Mistral, Qwen2, Qwen3: heads and KV heads split (KV heads replicated when there
    are fewer than ranks), q/k/v and gate/up fused column-parallel, o_proj and down_proj
    row-parallel."""

    def __init__(self, cfg: ModelConfig, group: RankGroup):
        super().__init__(cfg, group, rank_config(cfg, group))
        local = self.local
        self.layers = nn.ModuleList(
            DecoderLayer(local, f"model.layers.{self.layer_start + i}") for i in range(local.num_layers)
        )
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.o_proj = RowParallelLinear(attn.q_size, cfg.hidden_size, group)
            mlp.down_proj = RowParallelLinear(local.intermediate_size, cfg.hidden_size, group)

    def kv_cache_modules(self):
        return [layer.self_attn.attn for layer in self.layers]

    def _layer_placements(self, prefix: str, rest: str) -> list[Placement] | None:
        cfg, g, local = self.config, self.group, self.local
        tp, t, hd = g.tp, g.tp_rank, cfg.head_dim
        q_rows, kv_rows = local.num_heads * hd, local.num_kv_heads * hd
        qa, _ = head_range(cfg.num_heads, tp, t)
        ka, _ = kv_head_range(cfg.num_kv_heads, tp, t)
        mlp = swiglu_placements(prefix, rest, t, {"mlp.": local.intermediate_size})
        if mlp is not None:
            return mlp
        kind = rest.rsplit(".", 1)[-1]  # weight | bias
        column = {
            "self_attn.q_proj": (0, qa * hd, q_rows),
            "self_attn.k_proj": (q_rows, ka * hd, kv_rows),
            "self_attn.v_proj": (q_rows + kv_rows, ka * hd, kv_rows),
        }
        module = rest.rsplit(".", 1)[0]
        if module in column:
            dest, src, n = column[module]
            return [(f"{prefix}self_attn.qkv_proj.{kind}", slice(dest, dest + n), 0, src, src + n)]
        if module == "self_attn.o_proj":
            if kind == "bias":  # added once, after the sum
                return [(prefix + rest, None, 0, None, None)]
            return [(prefix + rest, None, 1, t * q_rows, (t + 1) * q_rows)]
        return [(prefix + rest, None, 0, None, None)]  # norms: replicated
