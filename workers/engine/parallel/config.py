"""How a replica is split over ranks, and what such a replica refuses."""

from __future__ import annotations

from dataclasses import dataclass

from workers.engine.errors import RequestError
from workers.protocol.parallel import PARALLEL_ARCHITECTURES, quantized_non_expert_layers


class ParallelError(RuntimeError):
    """A rank died, a collective timed out, or the group could not start: the whole group is
    torn down and the engine that raised it is unusable (a new one must be made)."""


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # Decoder layers per stage, e.g. (10, 14); None: as even as possible, earlier stages get
    # the remainder last (stage 0 also holds the embedding, the last stage the LM head).
    pipeline_stages: tuple[int, ...] | None = None
    # Micro-batches a step is split into when pp > 1; None: pp (docs/parallelism.md says why).
    micro_batches: int | None = None
    # No collective waits longer than this: a dead or stuck rank fails the group instead.
    timeout_s: float = 30.0
    # Torch threads per rank on CPU; None: the machine's cores shared evenly between ranks.
    threads_per_rank: int | None = None

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def num_micro_batches(self) -> int:
        return self.micro_batches or self.pipeline_parallel_size

    def rank_fields(self, rank: int) -> dict:
        """Where `rank` sits, as a KV layout names it: a rank exchanges blocks only with the rank
        at the same place in a group of the same shape (kvtransfer/ranks.py)."""
        tp = self.tensor_parallel_size
        return {"tp_rank": rank % tp, "tp_size": tp, "pp_rank": rank // tp, "pp_size": self.pipeline_parallel_size}

    def stage_layers(self, num_layers: int) -> list[tuple[int, int]]:
        """[start, end) decoder layers of each stage."""
        pp = self.pipeline_parallel_size
        if self.pipeline_stages is not None:
            counts = list(self.pipeline_stages)
            if len(counts) != pp or sum(counts) != num_layers or min(counts) < 1:
                raise RequestError(
                    f"pipeline_stages {counts} must give {pp} stages of at least one layer "
                    f"summing to the model's {num_layers} layers"
                )
        else:
            counts = [num_layers // pp + (1 if s < num_layers % pp else 0) for s in range(pp)]
        bounds, start = [], 0
        for n in counts:
            bounds.append((start, start + n))
            start += n
        return bounds

    def validate(self, model_config, engine_config) -> None:
        """Refuse, naming why, what a parallel group cannot run (before any rank starts)."""
        tp, pp = self.tensor_parallel_size, self.pipeline_parallel_size
        if tp < 1 or pp < 1:
            raise RequestError("tensor_parallel_size and pipeline_parallel_size must be at least 1")
        if self.world_size == 1:
            return
        if model_config.architecture not in PARALLEL_ARCHITECTURES:
            raise RequestError(
                f"tensor/pipeline parallelism is not built yet for {model_config.architecture}; "
                f"supported: {', '.join(PARALLEL_ARCHITECTURES)}"
            )
        quantized = quantized_non_expert_layers(model_config)
        if quantized:
            raise RequestError(
                f"int4 / fp8 quantized weights with tensor/pipeline parallelism are not built yet for {quantized[0]}; "
                "only DeepseekV3ForCausalLM's quantized routed experts are (each rank loads its experts whole)"
            )
        if model_config.num_heads % tp:
            raise RequestError(f"{model_config.num_heads} attention heads do not split over tensor_parallel_size={tp}")
        kv = model_config.num_kv_heads
        if model_config.mla is None and kv % tp and tp % kv:  # MLA's latent cache is replicated
            raise RequestError(f"{kv} KV heads neither split over nor replicate evenly onto tensor_parallel_size={tp}")
        moe = model_config.moe
        if moe is not None:
            if moe.n_routed_experts % tp:
                raise RequestError(f"{moe.n_routed_experts} routed experts do not split over tensor_parallel_size={tp}")
            shared = moe.moe_intermediate_size * moe.n_shared_experts
            if shared % tp:
                raise RequestError(f"shared-expert width {shared} does not split over tensor_parallel_size={tp}")
        dense_layers = moe is None or any(not moe.is_moe_layer(i) for i in range(model_config.num_layers))
        if dense_layers and model_config.intermediate_size % tp:
            raise RequestError(
                f"intermediate size {model_config.intermediate_size} does not split over tensor_parallel_size={tp}"
            )
        if pp > model_config.num_layers:
            raise RequestError(f"{model_config.num_layers} layers cannot fill pipeline_parallel_size={pp} stages")
        self.stage_layers(model_config.num_layers)
        if engine_config.kv_tiers:
            raise RequestError("KV tiers with tensor/pipeline parallelism are not built yet")
        if self.timeout_s <= 0:
            raise RequestError("the parallel timeout must be positive")
