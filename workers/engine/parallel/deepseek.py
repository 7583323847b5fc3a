"""One rank's part of DeepseekV3ForCausalLM (DeepSeek-V3, Kimi K2): MLA heads split over the
tensor-parallel ranks, routed experts split over them too (expert parallelism).

Attention: each rank keeps num_heads / tp heads: its rows of q_proj (or q_b_proj) and kv_b_proj,
its columns of o_proj (row-parallel, one all-reduce). The low-rank down-projections
(q_a_proj, kv_a_proj_with_mqa) and their norms are small and replicated, so every rank computes
the same latent and keeps the whole latent cache: MLA's cache has no heads to split (the
planner counts it per rank the same way; docs/parallelism.md).

Experts: rank t holds routed experts [t·n/tp, (t+1)·n/tp) whole. Activations are replicated
over the tensor-parallel ranks (they come out of an all-reduce), so "dispatch" is each rank
picking the (token, expert) pairs routed to its experts from the same routing, and "combine" is
the all-reduce the layer needs anyway: each rank adds its routed partial to its slice of the
shared experts (column/row split like a dense MLP) and one all-reduce sums the layer's output.
An all-to-all dispatch pays only when attention is data-parallel (each rank holding different
tokens), which this engine does not do. Dense first layers are split like Llama's MLP.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from workers.engine.config import ModelConfig
from workers.engine.layers.moe import MoE
from workers.engine.models.deepseek_v3 import MLP, DecoderLayer, expert_slot, make_experts
from workers.engine.parallel.group import RankGroup
from workers.engine.parallel.layers import RowParallelLinear, head_range
from workers.engine.parallel.model import Placement, ShardedStage, rank_config, swiglu_placements

_EXPERT = re.compile(r"mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.(\w+)")


class ParallelMoE(MoE):
    """The routed experts this rank holds plus its slice of the shared experts; the partial
    outputs of the stage's ranks are summed by one all-reduce."""

    def __init__(self, hidden: int, moe, shared: nn.Module | None, experts: nn.Module, group: RankGroup):
        super().__init__(hidden, moe, shared, experts)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(super().forward(x))


class DeepseekStage(ShardedStage):
    """A rank's layers of DeepseekV3ForCausalLM: its MLA heads, its routed experts
    [first_expert, end_expert), its slice of the shared experts and of the dense layers' MLP."""

    def __init__(self, cfg: ModelConfig, group: RankGroup):
        super().__init__(cfg, group, rank_config(cfg, group))
        local, moe, tp, quant = self.local, cfg.moe, group.tp, cfg.quantization
        self.shared_inter = moe.moe_intermediate_size * moe.n_shared_experts // tp
        self.first_expert, self.end_expert = head_range(moe.n_routed_experts, tp, group.tp_rank)
        self.layers = nn.ModuleList()
        for i in range(local.num_layers):
            index = self.layer_start + i
            prefix = f"model.layers.{index}.mlp."
            if moe.is_moe_layer(index):
                shared = None
                if moe.n_shared_experts:  # its down_proj's partial joins the layer's one all-reduce
                    shared = MLP(quant, cfg.hidden_size, self.shared_inter, prefix + "shared_experts.")
                held = self.end_expert - self.first_expert
                experts = make_experts(
                    quant, held, cfg.hidden_size, moe.moe_intermediate_size, prefix + "experts", self.first_expert
                )
                mlp = ParallelMoE(cfg.hidden_size, moe, shared, experts, group)
            else:
                mlp = MLP(quant, cfg.hidden_size, local.intermediate_size, prefix)
                mlp.down_proj = RowParallelLinear(local.intermediate_size, cfg.hidden_size, group)
            layer = DecoderLayer(local, index, mlp)  # MLA at this rank's heads
            attn = layer.self_attn
            attn.o_proj = RowParallelLinear(local.num_heads * attn.v_dim, cfg.hidden_size, group)
            self.layers.append(layer)

    def rope_dim(self) -> int:
        return self.config.mla.qk_rope_head_dim

    def materialize(self, device: torch.device) -> DeepseekStage:
        model = super().materialize(device)
        for attn in model.kv_cache_modules():
            attn.materialize(device)
        return model

    def kv_cache_modules(self):
        return [layer.self_attn for layer in self.layers]

    def _layer_placements(self, prefix: str, rest: str) -> list[Placement] | None:
        cfg, t, local, mla = self.config, self.group.tp_rank, self.local, self.config.mla
        heads, qk, v = local.num_heads, mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.v_head_dim
        per_head_rows = {
            "self_attn.q_proj.weight": qk,
            "self_attn.q_b_proj.weight": qk,
            "self_attn.kv_b_proj.weight": mla.qk_nope_head_dim + v,
        }
        if rest in per_head_rows:
            n = heads * per_head_rows[rest]
            return [(prefix + rest, None, 0, t * n, (t + 1) * n)]
        if rest == "self_attn.o_proj.weight":
            n = heads * v
            return [(prefix + rest, None, 1, t * n, (t + 1) * n)]
        m = _EXPERT.fullmatch(rest)
        if m:
            expert = int(m[1])
            if expert >= cfg.moe.n_routed_experts:
                return None
            if not self.first_expert <= expert < self.end_expert:
                return []  # another rank's expert (a quantized one held here loads by its own name)
            if m[3] != "weight":
                return None
            e = expert - self.first_expert
            target, rows = expert_slot(m[2], cfg.moe.moe_intermediate_size)
            return [(f"{prefix}mlp.experts.{target}", e if rows is None else (e, rows), 0, None, None)]
        if rest == "mlp.gate.weight":
            return [(prefix + "mlp.gate_weight", None, 0, None, None)]
        if rest == "mlp.gate.e_score_correction_bias":
            return [(prefix + "mlp.e_score_correction_bias", None, 0, None, None)]
        widths = {"mlp.": local.intermediate_size, "mlp.shared_experts.": self.shared_inter}
        mlp = swiglu_placements(prefix, rest, t, widths)
        if mlp is not None:
            return mlp
        return [(prefix + rest, None, 0, None, None)]  # norms and the low-rank projections: replicated

    def _after_load(self) -> None:
        super()._after_load()
        for attn in self.kv_cache_modules():
            attn.prepare()  # W_UK / W_UV of this rank's heads, for the absorbed decode
