"""Runs the model on one scheduled batch: builds the flat token batch and attention metadata,
owns the paged KV cache, and returns the logits of the sequences that sample this step.

A decoding sequence that verifies k speculative drafts runs as a chunk of k+1 query tokens
(its last token, then the drafts) through the same path as a chunked prefill: causal attention
over its cached context plus the chunk, K/V written for all k+1 (the engine rolls back what is
rejected); its logits are taken at all k+1 positions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from workers.engine import kernels
from workers.engine.config import EngineConfig, ModelConfig
from workers.engine.kv_layout import kv_layout_for
from workers.engine.layers.attention import AttentionMetadata
from workers.engine.scheduler import ScheduledSeq, SchedulerOutput

log = logging.getLogger(__name__)


def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    return kv_layout_for(cfg).bytes_per_block(block_size, dtype)


def num_kv_blocks(engine: EngineConfig, cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> int:
    """How many blocks the KV budget holds: a fraction of device memory on CUDA, bytes on CPU."""
    if engine.num_kv_blocks:
        return engine.num_kv_blocks
    per_block = kv_bytes_per_block(cfg, engine.block_size, dtype)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        used = total - free
        budget = int(total * engine.gpu_memory_utilization) - used
    else:
        budget = engine.kv_cache_bytes
    return max(budget // per_block, 0)


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        cfg: ModelConfig,
        engine: EngineConfig,
        device: torch.device,
        dtype: torch.dtype,
        num_blocks: int,
    ):
        self.model = model
        self.cfg = cfg
        self.device = device
        self.block_size = engine.block_size
        self.aux_hidden_states: torch.Tensor | None = None
        # One tensor for all layers, [layers, parts, blocks, block_size, heads, width]: dense
        # models keep K and V, MLA one latent per token (kv_layout.py).
        self.kv_layout = kv_layout_for(cfg)
        self.kv_cache = torch.zeros(self.kv_layout.shape(num_blocks, engine.block_size), dtype=dtype, device=device)
        for i, attn in enumerate(model.kv_cache_modules()):
            attn.bind_kv_cache(self.kv_cache[i])

    def kv_description(self) -> dict:
        """This runner's KV tensor as a peer must know it to exchange blocks with it (the engine
        adds the parallel ranks: LLMEngine.kv_layout, parallel/launch.py)."""
        kv = self.kv_cache
        return {
            "architecture": self.cfg.architecture,
            "kv_layout": self.kv_layout.kind,  # dense K/V or the MLA latent (kv_layout.py)
            "kv_parts": kv.shape[1],
            "dtype": str(kv.dtype).removeprefix("torch."),
            "block_size": self.block_size,
            "num_layers": kv.shape[0],
            "num_kv_heads": kv.shape[4],
            "head_dim": kv.shape[5],
            "num_blocks": kv.shape[2],
        }

    def _tensor(self, data, dtype=torch.int64) -> torch.Tensor:
        return torch.tensor(data, dtype=dtype, device=self.device)

    @torch.inference_mode()
    def execute(self, batch: SchedulerOutput, keep_aux: bool = True) -> tuple[torch.Tensor, list[ScheduledSeq]]:
        """Returns (logits fp32, the scheduled sequences that sample, in order). Each of
        those has one row of logits, its last token's, or, when it verifies drafts, one row
        per query token: its last token's, then each draft's. `keep_aux` matters to a parallel
        group only: here an EAGLE-3 head's states are this process's, and kept every step."""
        plan, sampling = plan_step(batch, self.block_size)
        return self.run(plan), sampling

    def run(self, plan: StepPlan) -> torch.Tensor:
        input_ids, positions, meta, logits_indices = self.inputs(plan)
        logits = self.model(input_ids, positions, meta, logits_indices)
        # With an EAGLE-3 drafter: the target's hidden states at its aux layers, one row per
        # token computed, in batch order (the engine hands each sequence its rows).
        self.aux_hidden_states = self.model.aux_hidden_states
        return logits

    def inputs(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        """The step's tensors on this runner's device, from its plain-data plan."""
        meta = AttentionMetadata(slot_mapping=self._tensor(plan.slots), num_prefill_tokens=plan.num_prefill_tokens)
        if plan.prefill_cu_q_lens:
            meta.prefill_cu_q_lens = self._tensor(plan.prefill_cu_q_lens, torch.int32)
            meta.prefill_context_lens = self._tensor(plan.prefill_context_lens, torch.int32)
            meta.prefill_block_tables = self._tensor(plan.prefill_block_tables, torch.int32)
            if self.kv_layout.kind == "dense" and not kernels.use_triton(meta.prefill_block_tables):
                meta.prefill_plan = kernels.plan_prefill(  # MLA's prefill (layers/mla.py) needs none
                    meta.prefill_block_tables,
                    meta.prefill_cu_q_lens,
                    meta.prefill_context_lens,
                    self.block_size,
                    self.kv_cache.dtype,
                )
        if plan.decode_context_lens:
            meta.decode_context_lens = self._tensor(plan.decode_context_lens, torch.int32)
            meta.decode_block_tables = self._tensor(plan.decode_block_tables, torch.int32)
            if not kernels.use_triton(meta.decode_block_tables):
                meta.decode_plan = kernels.plan_decode(
                    meta.decode_block_tables, meta.decode_context_lens, self.block_size, self.kv_cache.dtype
                )
        return self._tensor(plan.input_ids), self._tensor(plan.positions), meta, self._tensor(plan.logits_indices)


@dataclass
class StepPlan:
    """One step's batch as plain lists: what every rank of a parallel group needs to run it
    (parallel/ sends it from rank 0), and what `ModelRunner.inputs` turns into tensors."""

    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    logits_indices: list[int] = field(default_factory=list)
    keep_aux: bool = True  # a parallel group brings an EAGLE-3 head's states to rank 0 (ParallelRunner)
    num_prefill_tokens: int = 0
    prefill_cu_q_lens: list[int] = field(default_factory=list)
    prefill_context_lens: list[int] = field(default_factory=list)
    prefill_block_tables: list[list[int]] = field(default_factory=list)
    decode_context_lens: list[int] = field(default_factory=list)
    decode_block_tables: list[list[int]] = field(default_factory=list)


def _padded(tables: list[list[int]]) -> list[list[int]]:
    width = max(len(t) for t in tables)
    return [t + [0] * (width - len(t)) for t in tables]


def plan_step(batch: SchedulerOutput, block_size: int) -> tuple[StepPlan, list[ScheduledSeq]]:
    """The step's plan, and the scheduled sequences that sample (in logits row order)."""
    plan = StepPlan()
    sampling: list[ScheduledSeq] = []
    bs = block_size
    for item in batch.all:
        seq, start = item.seq, item.seq.num_computed_tokens
        end = start + item.num_tokens
        plan.input_ids.extend(seq.token_ids[start : end - len(item.draft_token_ids)])
        plan.input_ids.extend(item.draft_token_ids)
        plan.positions.extend(range(start, end))
        table = seq.block_table
        plan.slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
        if item.samples:
            first = len(plan.input_ids) - 1 - len(item.draft_token_ids)
            plan.logits_indices.extend(range(first, len(plan.input_ids)))
            sampling.append(item)
    plan.num_prefill_tokens = sum(s.num_tokens for s in batch.prefills)
    if batch.prefills:
        plan.prefill_cu_q_lens = [0]
        for s in batch.prefills:
            plan.prefill_cu_q_lens.append(plan.prefill_cu_q_lens[-1] + s.num_tokens)
        plan.prefill_context_lens = [s.seq.num_computed_tokens + s.num_tokens for s in batch.prefills]
        plan.prefill_block_tables = _padded([s.seq.block_table for s in batch.prefills])
    if batch.decodes:
        plan.decode_context_lens = [s.seq.num_computed_tokens + 1 for s in batch.decodes]
        plan.decode_block_tables = _padded([s.seq.block_table for s in batch.decodes])
    return plan, sampling
