"""DeepseekV3ForCausalLM: DeepSeek-V3 and Kimi K2 (which declare this architecture too).

Each decoder layer is multi-head latent attention (layers/mla.py: the paged cache holds one
latent + rope key per token) and either a dense SwiGLU MLP (the first `first_k_dense_replace`
layers) or the mixture of experts (layers/moe.py). Rope is yarn-scaled in the real configs
(layers/rotary.py). The checkpoint's multi-token-prediction layer (`model.layers.<num_layers>`,
DeepSeek-V3's `num_nextn_predict_layers`) is not used and not loaded.

Every linear layer is made by `layers.quantized.make_linear` (dense, int4 or fp8 as the
checkpoint's quantization config says of that module) and every routed-expert set by
`make_experts` (stacked dense tensors, or a quantized layer pair per expert).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from workers.engine import kernels
from workers.engine.config import ModelConfig
from workers.engine.errors import ModelLoadError
from workers.engine.layers.attention import AttentionMetadata
from workers.engine.layers.embedding import Embedding
from workers.engine.layers.mla import MLAttention
from workers.engine.layers.moe import ExpertLinears, Experts, MoE
from workers.engine.layers.norm import RMSNorm
from workers.engine.layers.quantized import make_linear, prepare_linears, quantized_tensor_layout
from workers.engine.layers.rotary import cos_sin_table
from workers.engine.meta_device import empty_on
from workers.engine.models.aux_states import AuxStates, run_layers
from workers.protocol.quantization import QuantConfig


def linear_factory(quant: QuantConfig | None):
    """MLAttention's linear factory: (in, out, checkpoint module name) → dense, int4 or fp8 as the
    checkpoint's quantization config says of that module."""

    def linear(in_features: int, out_features: int, name: str) -> nn.Module:
        return make_linear(quant, name, in_features, out_features)

    return linear


def make_experts(
    quant: QuantConfig | None, n: int, hidden: int, inter: int, prefix: str, first_expert: int = 0
) -> nn.Module:
    """A layer's routed experts [first_expert, first_expert + n) (all of them on one device, a
    rank's share under expert parallelism): stacked dense tensors, or quantized layers per
    expert when the config quantizes them (Kimi K2's int4 experts, DeepSeek-V3's fp8)."""
    held = range(first_expert, first_expert + n)
    modules = [f"{prefix}.{e}.{part}" for e in held for part in ("gate_proj", "up_proj", "down_proj")]
    schemes = {quant.scheme_for(m) for m in modules} if quant is not None else {None}
    if schemes == {None}:
        return Experts(n, hidden, inter, first_expert)
    if None in schemes:
        raise ModelLoadError(f"quantization_config leaves some of {prefix}'s experts dense: not built")
    return ExpertLinears(n, hidden, inter, prefix, lambda names, i, o: make_linear(quant, names, i, o), first_expert)


def expert_slot(part: str, inter: int) -> tuple[str, slice | None]:
    """Where one expert's checkpoint `part` (gate_proj, up_proj, down_proj) goes in the stacked
    store (`Experts`): its tensor and, within that expert's row, the rows it fills."""
    if part == "down_proj":
        return "down", None
    return "gate_up", slice(0, inter) if part == "gate_proj" else slice(inter, 2 * inter)


class MLP(nn.Module):
    """SwiGLU with gate and up fused (the dense layers' MLP and the shared experts)."""

    def __init__(self, quant: QuantConfig | None, hidden: int, inter: int, prefix: str):
        super().__init__()
        self.inter = inter
        self.gate_up_proj = make_linear(quant, (f"{prefix}gate_proj", f"{prefix}up_proj"), hidden, (inter, inter))
        self.down_proj = make_linear(quant, f"{prefix}down_proj", inter, hidden)

    def forward(self, x):
        return self.down_proj(kernels.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int, mlp: nn.Module | None = None):
        """`mlp`: the layer's MLP or MoE when the caller builds it (a rank's share of it:
        parallel/deepseek.py); None builds the whole one."""
        super().__init__()
        prefix = f"model.layers.{index}."
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        quant = cfg.quantization
        self.self_attn = MLAttention(cfg, linear_factory(quant), prefix + "self_attn.")
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        moe = cfg.moe
        if mlp is not None:
            self.mlp = mlp
        elif moe.is_moe_layer(index):
            shared = None
            if moe.n_shared_experts:
                inter = moe.moe_intermediate_size * moe.n_shared_experts
                shared = MLP(quant, cfg.hidden_size, inter, prefix + "mlp.shared_experts.")
            experts = make_experts(
                quant, moe.n_routed_experts, cfg.hidden_size, moe.moe_intermediate_size, prefix + "mlp.experts"
            )
            self.mlp = MoE(cfg.hidden_size, moe, shared, experts)
        else:
            self.mlp = MLP(quant, cfg.hidden_size, cfg.intermediate_size, prefix + "mlp.")

    def forward(self, x, rope, meta):
        x = x + self.self_attn(self.input_layernorm(x), rope, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class DeepseekV3Model(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Layers whose outputs an EAGLE-3 head reads (aux_states.py).
        self.aux_layer_ids: tuple[int, ...] = ()
        self.aux_hidden_states: torch.Tensor | None = None

    def forward(self, input_ids, positions, cos_sin, meta):
        x = self.embed_tokens(input_ids)
        rope = cos_sin.index_select(0, positions)
        x, self.aux_hidden_states = run_layers(self.layers, x, rope, meta, self.aux_layer_ids)
        return self.norm(x)


# Checkpoint tensor name → (our parameter, rows of it) for the parts stored fused or stacked here.
_FUSED = re.compile(r"(.*\.)(gate_proj|up_proj)\.weight$")
_EXPERT = re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


class DeepseekV3ForCausalLM(AuxStates, nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = DeepseekV3Model(cfg)
        self.lm_head = make_linear(cfg.quantization, "lm_head", cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("cos_sin", torch.empty(0), persistent=False)  # built by materialize

    def _table(self) -> torch.Tensor:
        cfg = self.config
        return cos_sin_table(cfg.mla.qk_rope_head_dim, cfg.max_position_embeddings, cfg.rope)

    def materialize(self, device: torch.device) -> DeepseekV3ForCausalLM:
        """Real storage on `device` for a model built on the meta device; buffers are rebuilt."""
        model = empty_on(self, device)
        if self.config.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        model.cos_sin = self._table().to(device)
        for layer in model.model.layers:
            layer.self_attn.materialize(device)
        return model

    def forward(self, input_ids, positions, meta: AttentionMetadata, logits_indices: torch.Tensor) -> torch.Tensor:
        hidden = self.model(input_ids, positions, self.cos_sin, meta)
        return self.lm_head(hidden.index_select(0, logits_indices)).float()

    def kv_cache_modules(self) -> list[MLAttention]:
        return [layer.self_attn for layer in self.model.layers]

    def _destination(self, name: str, params: dict) -> torch.Tensor | None:
        """Where checkpoint tensor `name` goes (a view of one of our parameters), or None."""
        m = _EXPERT.match(name)
        if m:
            experts = params.get(f"{m[1]}.gate_up")
            if experts is None:
                return None
            e = int(m[2])
            if e >= experts.shape[0]:
                return None
            target, rows = expert_slot(m[3], experts.shape[1] // 2)
            dest = params[f"{m[1]}.{target}"].data[e]
            return dest if rows is None else dest[rows]
        if name.endswith(".mlp.gate.weight"):
            return self._param(params, name.replace(".gate.weight", ".gate_weight"))
        if name.endswith(".mlp.gate.e_score_correction_bias"):
            return self._buffer(name.replace(".gate.", "."))
        m = _FUSED.match(name)
        if m:
            fused = params.get(f"{m[1]}gate_up_proj.weight")
            if fused is None:
                return None
            inter = fused.shape[0] // 2
            return fused.data[:inter] if m[2] == "gate_proj" else fused.data[inter:]
        return self._param(params, name)

    @staticmethod
    def _param(params: dict, name: str) -> torch.Tensor | None:
        p = params.get(name)
        return None if p is None else p.data

    def _buffer(self, name: str) -> torch.Tensor | None:
        return dict(self.named_buffers()).get(name)

    def _expected(self) -> set[str]:
        """Every checkpoint tensor name this model needs."""
        names = set(quantized_tensor_layout(self))
        for name, p in self.named_parameters():
            if name.endswith(".gate_up_proj.weight"):
                names |= {name.replace("gate_up_proj", "gate_proj"), name.replace("gate_up_proj", "up_proj")}
            elif name.endswith(".experts.gate_up"):
                base = name.removesuffix(".gate_up")
                for e in range(p.shape[0]):
                    names |= {f"{base}.{e}.gate_proj.weight", f"{base}.{e}.up_proj.weight"}
            elif name.endswith(".experts.down"):
                base = name.removesuffix(".down")
                names |= {f"{base}.{e}.down_proj.weight" for e in range(p.shape[0])}
            elif name.endswith(".mlp.gate_weight"):
                names.add(name.replace(".gate_weight", ".gate.weight"))
            else:
                names.add(name)
        for name, _ in self.named_buffers():
            if name.endswith(".e_score_correction_bias"):
                names.add(name.replace(".mlp.", ".mlp.gate."))
        return names

    @torch.no_grad()
    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        quantized = quantized_tensor_layout(self)
        missing = self._expected()
        for name, tensor in tensors:
            layer = _LAYER.match(name)
            if layer and int(layer[1]) >= self.config.num_layers:
                continue  # the multi-token-prediction layer
            if "rotary_emb.inv_freq" in name or (self.config.tie_word_embeddings and name == "lm_head.weight"):
                continue
            if name in quantized:
                module, suffix, rows = quantized[name]
                module.load_tensor(name, suffix, tensor, rows)
                missing.discard(name)
                continue
            dest = self._destination(name, params)
            if dest is None:
                raise ModelLoadError(f"checkpoint tensor {name!r} has no place in {self.config.architecture}")
            if dest.shape != tensor.shape:
                raise ModelLoadError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}"
                )
            dest.copy_(tensor)
            missing.discard(name)
        if missing:
            raise ModelLoadError(f"checkpoint is missing tensors: {', '.join(sorted(missing)[:8])}")
        prepare_linears(self)
        for attn in self.kv_cache_modules():
            attn.prepare()
