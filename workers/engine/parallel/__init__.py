"""Tensor and pipeline parallelism: one replica over several ranks (docs/parallelism.md).

- `config`: `ParallelConfig` (sizes, stage split, timeouts) and what is refused at TP/PP > 1.
- `group`: the torch.distributed process group (gloo on CPU, NCCL on CUDA) and its sub-groups.
- `layers`: shard arithmetic, row-parallel linear, vocab-parallel embedding and LM head.
- `model`: one rank's part of a Llama-family model, loaded from safetensors slices.
- `runner`: the rank's ModelRunner: micro-batches through the pipeline, logits back to rank 0.
- `launch`: rank 0 spawns the other ranks, each runs `worker_main` until told to stop.

Rank r sits in stage r // tp at tensor rank r % tp. Rank 0 (stage 0, tensor rank 0) owns the
scheduler, the block manager and sampling; every step it broadcasts the plan to the others.
"""

from workers.engine.parallel.config import ParallelConfig, ParallelError

__all__ = ["ParallelConfig", "ParallelError"]
