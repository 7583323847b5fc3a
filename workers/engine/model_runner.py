"""Runs the model on one scheduled batch: builds the flat token batch and attention metadata,
owns the paged KV cache, and returns the logits of the sequences that sample this step.

A decoding sequence that verifies k speculative drafts runs as a chunk of k+1 query tokens
(its last token, then the drafts) through the same path as a chunked prefill: causal attention
over its cached context plus the chunk, K/V written for all k+1 (the engine rolls back what is
rejected); its logits are taken at all k+1 positions.
"""

from __future__ import annotations

import logging

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

    def _tensor(self, data, dtype=torch.int64) -> torch.Tensor:
        return torch.tensor(data, dtype=dtype, device=self.device)

    def _block_tables(self, items: list[ScheduledSeq]) -> torch.Tensor:
        width = max(len(s.seq.block_table) for s in items)
        rows = [s.seq.block_table + [0] * (width - len(s.seq.block_table)) for s in items]
        return self._tensor(rows, torch.int32)

    @torch.inference_mode()
    def execute(self, batch: SchedulerOutput) -> tuple[torch.Tensor, list[ScheduledSeq]]:
        """Returns (logits fp32, the scheduled sequences that sample, in order). Each of
        those has one row of logits, its last token's, or, when it verifies drafts, one row
        per query token: its last token's, then each draft's."""
        items = batch.all
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_indices: list[int] = []
        sampling: list[ScheduledSeq] = []
        bs = self.block_size
        for item in items:
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_tokens
            input_ids.extend(seq.token_ids[start : end - len(item.draft_token_ids)])
            input_ids.extend(item.draft_token_ids)
            positions.extend(range(start, end))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            if item.samples:
                first = len(input_ids) - 1 - len(item.draft_token_ids)
                logits_indices.extend(range(first, len(input_ids)))
                sampling.append(item)
        num_prefill_tokens = sum(s.num_tokens for s in batch.prefills)
        meta = AttentionMetadata(slot_mapping=self._tensor(slots), num_prefill_tokens=num_prefill_tokens)
        if batch.prefills:
            cu = [0]
            for s in batch.prefills:
                cu.append(cu[-1] + s.num_tokens)
            meta.prefill_cu_q_lens = self._tensor(cu, torch.int32)
            meta.prefill_context_lens = self._tensor(
                [s.seq.num_computed_tokens + s.num_tokens for s in batch.prefills], torch.int32
            )
            meta.prefill_block_tables = self._block_tables(batch.prefills)
        if batch.decodes:
            meta.decode_context_lens = self._tensor([s.seq.num_computed_tokens + 1 for s in batch.decodes], torch.int32)
            meta.decode_block_tables = self._block_tables(batch.decodes)
            if not kernels.use_triton(meta.decode_block_tables):
                meta.decode_plan = kernels.plan_decode(
                    meta.decode_block_tables, meta.decode_context_lens, self.block_size, self.kv_cache.dtype
                )
        logits = self.model(self._tensor(input_ids), self._tensor(positions), meta, self._tensor(logits_indices))
        # With an EAGLE-3 drafter: the target's hidden states at its aux layers, one row per
        # token computed, in batch order (the engine hands each sequence its rows).
        self.aux_hidden_states = self.model.aux_hidden_states
        return logits, sampling
