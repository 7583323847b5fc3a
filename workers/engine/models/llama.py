"""The Llama decoder family: Llama 2/3 (incl. llama3 rope scaling), and the base that Mistral,
Qwen2 and Qwen3 specialise (`attention_bias`, `qk_norm` in `ModelConfig` switch their parts).

Projections are fused for speed: q/k/v → `qkv_proj` and gate/up → `gate_up_proj`;
`load_weights` maps the Hugging Face tensor names onto the fused slices. Linear layers come from
`make_linear`, which makes them int4 or fp8 where the checkpoint's quantization_config says so
(layers/quantized.py); those load their own tensors.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from workers.engine import kernels
from workers.engine.config import ModelConfig
from workers.engine.errors import ModelLoadError
from workers.engine.layers.attention import AttentionMetadata, PagedAttention
from workers.engine.layers.embedding import Embedding
from workers.engine.layers.linear import Linear
from workers.engine.layers.norm import RMSNorm
from workers.engine.layers.quantized import make_linear, prepare_linears, quantized_tensor_layout
from workers.engine.layers.rotary import cos_sin_table
from workers.engine.meta_device import empty_on
from workers.engine.models.aux_states import AuxStates, run_layers


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, prefix: str):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = make_linear(
            cfg.quantization,
            [f"{prefix}.{p}_proj" for p in "qkv"],
            cfg.hidden_size,
            (self.q_size, self.kv_size, self.kv_size),
            bias=cfg.attention_bias,
        )
        self.o_proj = make_linear(cfg.quantization, f"{prefix}.o_proj", self.q_size, cfg.hidden_size)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.attn = PagedAttention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)

    def forward(self, x, rope, meta: AttentionMetadata):
        qkv = self.qkv_proj(x)
        qk_size = self.q_size + self.kv_size
        v = qkv[:, qk_size:].view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is None:
            # q and k sit side by side in qkv: one rotary call turns both (a decode step is
            # dozens of small ops per layer, so each one saved shows at batch 1).
            qk = kernels.apply_rotary(
                qkv[:, :qk_size].view(-1, self.num_heads + self.num_kv_heads, self.head_dim), rope
            )
            q, k = qk.split((self.num_heads, self.num_kv_heads), dim=1)
        else:
            q = self.q_norm(qkv[:, : self.q_size].view(-1, self.num_heads, self.head_dim))
            k = self.k_norm(qkv[:, self.q_size : qk_size].view(-1, self.num_kv_heads, self.head_dim))
            q = kernels.apply_rotary(q, rope)
            k = kernels.apply_rotary(k, rope)
        out = self.attn(q, k, v, meta)
        return self.o_proj(out.view(-1, self.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, prefix: str):
        super().__init__()
        q, n = cfg.quantization, cfg.intermediate_size
        self.gate_up_proj = make_linear(q, [f"{prefix}.gate_proj", f"{prefix}.up_proj"], cfg.hidden_size, (n, n))
        self.down_proj = make_linear(q, f"{prefix}.down_proj", n, cfg.hidden_size)

    def forward(self, x):
        return self.down_proj(kernels.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, prefix: str):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, f"{prefix}.self_attn")
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, f"{prefix}.mlp")

    def forward(self, x, rope, meta):
        x = x + self.self_attn(self.input_layernorm(x), rope, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, f"model.layers.{i}") for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Layers whose outputs an EAGLE-3 head reads (aux_states.py).
        self.aux_layer_ids: tuple[int, ...] = ()
        self.aux_hidden_states: torch.Tensor | None = None

    def forward(self, input_ids, positions, cos_sin, meta):
        x = self.embed_tokens(input_ids)
        rope = cos_sin.index_select(0, positions)  # each token's cos/sin row, shared by every layer
        x, self.aux_hidden_states = run_layers(self.layers, x, rope, meta, self.aux_layer_ids)
        return self.norm(x)


# A fused parameter → the checkpoint tensors stacked in it, in row order.
_STACKED = {
    ".qkv_proj.": (".q_proj.", ".k_proj.", ".v_proj."),
    ".gate_up_proj.": (".gate_proj.", ".up_proj."),
}


class LlamaForCausalLM(AuxStates, nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        if cfg.tie_word_embeddings:  # the embedding's matrix, so never quantized
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        else:
            self.lm_head = make_linear(cfg.quantization, "lm_head", cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("cos_sin", torch.empty(0), persistent=False)  # built by materialize

    def materialize(self, device: torch.device) -> LlamaForCausalLM:
        """Give a model built on the meta device real (uninitialised) storage on `device`;
        `empty_on` (like `to_empty`) unties shared weights and leaves buffers empty, so redo both."""
        model = empty_on(self, device)
        if self.config.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        cfg = self.config
        model.cos_sin = cos_sin_table(cfg.head_dim, cfg.max_position_embeddings, cfg.rope).to(device)
        return model

    def forward(self, input_ids, positions, meta: AttentionMetadata, logits_indices: torch.Tensor) -> torch.Tensor:
        """Hidden states of every token; logits (fp32) only at `logits_indices`."""
        hidden = self.model(input_ids, positions, self.cos_sin, meta)
        return self.lm_head(hidden.index_select(0, logits_indices)).float()

    def kv_cache_modules(self) -> list[PagedAttention]:
        return [layer.self_attn.attn for layer in self.model.layers]

    def _row_ranges(self, fused: str) -> list[tuple[int, int]]:
        cfg = self.config
        if fused == ".qkv_proj.":
            sizes = [cfg.num_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2
        else:
            sizes = [cfg.intermediate_size] * 2
        starts = [sum(sizes[:k]) for k in range(len(sizes))]
        return [(a, a + n) for a, n in zip(starts, sizes, strict=True)]

    def _checkpoint_layout(self) -> dict[str, tuple[str, tuple[int, int] | None]]:
        """Each expected checkpoint tensor → (our parameter, the rows it fills, or None for all)."""
        layout: dict[str, tuple[str, tuple[int, int] | None]] = {}
        for name, _ in self.named_parameters():  # a tied lm_head appears once, as the embedding
            for fused, parts in _STACKED.items():
                if fused in name:
                    for part, rows in zip(parts, self._row_ranges(fused), strict=True):
                        layout[name.replace(fused, part)] = (name, rows)
                    break
            else:
                layout[name] = (name, None)
        return layout

    @torch.no_grad()
    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        layout = self._checkpoint_layout()
        quantized = quantized_tensor_layout(self)
        missing = set(layout) | set(quantized)
        for name, tensor in tensors:
            if "rotary_emb.inv_freq" in name or (self.config.tie_word_embeddings and name == "lm_head.weight"):
                continue
            if name in quantized:
                module, suffix, part_rows = quantized[name]
                module.load_tensor(name, suffix, tensor, part_rows)
                missing.discard(name)
                continue
            if name not in layout:
                raise ModelLoadError(f"checkpoint tensor {name!r} has no place in {self.config.architecture}")
            target, rows = layout[name]
            dest = params[target].data if rows is None else params[target].data[rows[0] : rows[1]]
            if dest.shape != tensor.shape:
                raise ModelLoadError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}"
                )
            dest.copy_(tensor)
            missing.discard(name)
        if missing:
            raise ModelLoadError(f"checkpoint is missing tensors: {', '.join(sorted(missing)[:8])}")
        prepare_linears(self)
