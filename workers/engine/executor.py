"""Where a step runs: `DeviceExecutor` (the model in this process, on one device) or a
`ParallelGroup` (parallel/launch.py: tensor/pipeline-parallel ranks, rank 0 in this process).
Both offer what the engine uses, so the loop never asks which one it has:

    model                rank 0's model (an EAGLE-3 head reads its embedding and aux layers)
    num_blocks           KV blocks the cache holds (each rank's, in a group)
    kv_cache             rank 0's KV tensor (KV tiers copy blocks in and out of it)
    execute(batch, keep_aux) -> (logits, the sequences that sample)
    aux_hidden_states    the last step's states for an EAGLE-3 head
    kv_description()     what a peer must match to exchange KV blocks (rank 0's part)
    check()              raise if the executor broke (a rank died); a no-op on one device
    memory()             per rank: bytes of weights, KV cache and the rest
    close()              stop what it started
"""

from __future__ import annotations

import torch

from workers.engine.config import EngineConfig, ModelConfig
from workers.engine.loader import load_model
from workers.engine.memory import rank_memory
from workers.engine.model_runner import ModelRunner, num_kv_blocks
from workers.engine.parallel.config import ParallelConfig
from workers.engine.speculative.config import SpeculativeConfig


def make_executor(
    config: EngineConfig,
    model_config: ModelConfig,
    parallel: ParallelConfig,
    device: torch.device,
    dtype: torch.dtype,
    speculative: SpeculativeConfig | None,
):
    """The executor `parallel` asks for. A group's ranks learn before they start which layer
    states an EAGLE-3 head reads and whether they must read its embedding (refused here, before
    any rank starts, when the head does not fit)."""
    if parallel.world_size == 1:
        return DeviceExecutor(config, model_config, device, dtype)
    from workers.engine.parallel.launch import ParallelGroup

    aux_layers, draft_embedding = (), False
    if speculative is not None and speculative.model is not None:  # an EAGLE-3 head (eagle3, auto)
        from workers.engine.speculative.eagle3 import head_aux_layers, head_has_embedding

        aux_layers = head_aux_layers(speculative.model, config.model, model_config.num_layers)
        draft_embedding = not head_has_embedding(speculative.model)
    return ParallelGroup(config, model_config, parallel, dtype, aux_layers, draft_embedding)


class DeviceExecutor:
    """One device: the model and its runner (model_runner.py) in this process."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig, device: torch.device, dtype: torch.dtype):
        self.device = device
        self.model = load_model(config.model, model_config, device, dtype)
        self.num_blocks = num_kv_blocks(config, model_config, device, dtype)  # what the weights left
        self.runner = ModelRunner(self.model, model_config, config, device, dtype, self.num_blocks)

    @property
    def kv_cache(self) -> torch.Tensor:
        return self.runner.kv_cache

    @property
    def aux_hidden_states(self):
        return self.runner.aux_hidden_states

    def execute(self, batch, keep_aux: bool = True):
        return self.runner.execute(batch, keep_aux)

    def kv_description(self) -> dict:
        return self.runner.kv_description()

    def check(self) -> None:
        pass

    def memory(self) -> list[dict]:
        return [rank_memory(0, self.model, self.runner.kv_cache, self.device)]

    def close(self) -> None:
        pass
