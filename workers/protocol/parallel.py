"""What a parallel (tensor/pipeline) replica shards, read without torch: the engine refuses a
parallel replica outside it (workers/engine/parallel/config.py) and the control plane refuses the
deployment before any replica starts (controlplane/deployments/compatibility.py)."""

from __future__ import annotations

# The families whose layers the parallel model shards (architectures.py): the dense Llama family
# (parallel/model.py) and DeepSeek-V3 / Kimi K2, MLA + MoE (parallel/deepseek.py).
from workers.protocol.architectures import PARALLEL_ARCHITECTURES

__all__ = ["PARALLEL_ARCHITECTURES", "quantized_non_expert_layers"]


def quantized_non_expert_layers(cfg) -> list[str]:
    """The quantized linear layers other than routed experts. A parallel group runs quantized
    weights only as routed experts, which each rank loads whole (parallel/deepseek.py): the
    stage model builds every other layer dense (or row/column-parallel), and slicing a packed
    int4 or fp8 block-scaled matrix per rank is not built. Kimi K2's int4 layout (experts only)
    therefore runs; DeepSeek-V3's fp8 (every linear layer) does not."""
    quant = cfg.quantization
    if quant is None:
        return []
    names = ["lm_head"]
    for i in range(cfg.num_layers):
        layer = f"model.layers.{i}."
        if cfg.moe is None:
            attn = [f"{p}_proj" for p in "qkvo"]
            mlp = "mlp."
        else:
            attn = ["q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
            mlp = "mlp.shared_experts." if cfg.moe.is_moe_layer(i) else "mlp."
        names += [f"{layer}self_attn.{p}" for p in attn]
        names += [f"{layer}{mlp}{p}_proj" for p in ("gate", "up", "down")]
    return [name for name in names if quant.scheme_for(name) is not None]
