"""A rank's model runner: the step's micro-batches through this rank's stage.

Every rank runs the same plans (rank 0 makes them, `launch` delivers them), so every rank
builds the same attention metadata and writes its own share of the KV cache at the same slots;
the block tables are rank 0's, valid on every rank because each holds the same number of blocks.

Pipeline: a step's sequences are split into `num_micro_batches` groups. Stage 0 computes the
first, sends its activations on (asynchronously) and goes on to the second while stage 1
computes the first, and so on; the last stage's logits come back to rank 0 in batch order.
"""

from __future__ import annotations

import torch

from workers.engine.model_runner import ModelRunner, StepPlan, plan_step
from workers.engine.parallel.group import RankGroup
from workers.engine.scheduler import ScheduledSeq, SchedulerOutput


def split_batch(batch: SchedulerOutput, n: int) -> list[SchedulerOutput]:
    """At most `n` micro-batches of whole sequences, contiguous in batch order (so their
    sampled rows, concatenated, keep the batch's order), with about equal token counts."""
    items = batch.all
    n = max(1, min(n, len(items)))
    if n == 1:
        return [batch]
    total = sum(s.num_tokens for s in items)
    groups: list[list[ScheduledSeq]] = [[]]
    acc = 0
    for i, item in enumerate(items):
        left_items, left_groups = len(items) - i, n - len(groups)
        if groups[-1] and len(groups) < n and (acc >= total * len(groups) / n or left_items <= left_groups):
            groups.append([])
        groups[-1].append(item)
        acc += item.num_tokens
    prefills = {id(s) for s in batch.prefills}
    return [
        SchedulerOutput([s for s in g if id(s) in prefills], [s for s in g if id(s) not in prefills], [])
        for g in groups
    ]


class ParallelRunner(ModelRunner):
    def __init__(self, model, local_cfg, engine, device, dtype, num_blocks, group: RankGroup):
        super().__init__(model, local_cfg, engine, device, dtype, num_blocks)
        self.group = group
        self.hidden_size = model.config.hidden_size
        self.vocab_size = model.config.vocab_size
        self.dtype = dtype

    @torch.inference_mode()
    def execute(self, batch: SchedulerOutput, keep_aux: bool = True) -> tuple[torch.Tensor, list[ScheduledSeq]]:
        """Rank 0: plan, send the plans to every rank, run stage 0, collect the logits.
        `keep_aux`: bring an EAGLE-3 head's states to rank 0 this step (the engine feeds the
        head only when the next step drafts; they are tokens x 3 x hidden)."""
        plans, sampling = [], []
        for part in split_batch(batch, self.group.parallel.num_micro_batches):
            plan, rows = plan_step(part, self.block_size)
            plan.keep_aux = keep_aux
            plans.append(plan)
            sampling.extend(rows)
        self.group.broadcast_command(("step", plans))
        return self.run_stage(plans), sampling

    @torch.inference_mode()
    def run_stage(self, plans: list[StepPlan]) -> torch.Tensor | None:
        """This rank's share of the step; rank 0 gets the logits, the others None."""
        g, model = self.group, self.model
        pending = []  # async sends: their tensors stay alive until they are waited on
        to_rank0 = []  # a later stage's aux parts and logits, in micro-batch order
        logits_parts: list[torch.Tensor | None] = []
        aux_parts = []  # rank 0: its stage's part of an EAGLE-3 head's states, by micro-batch
        for plan in plans:
            input_ids, positions, meta, logits_indices = self.inputs(plan)
            n = len(plan.input_ids)
            if g.is_first_stage:
                x = model.embed(input_ids)
            else:
                x = torch.empty(n, self.hidden_size, dtype=self.dtype, device=self.device)
                g.recv(x, src=g.peer(g.stage - 1))
            x = model.decode_layers(x, positions, meta, keep_aux=plan.keep_aux)
            if g.rank == 0:
                aux_parts.append(model.aux_hidden_states)
            elif model.aux_hidden_states is not None:  # a later stage's first rank (the only one keeping them)
                to_rank0.append(model.aux_hidden_states)
            if not g.is_last_stage:
                pending.append((g.send(x.contiguous(), dst=g.peer(g.stage + 1)), x))
                logits_parts.append(None)
                continue
            logits = model.logits(x, logits_indices)
            if g.rank == 0:
                logits_parts.append(logits)
            elif g.rank == g.last_stage_leader and len(plan.logits_indices):
                to_rank0.append(logits)
        # Only now, every micro-batch received: rank 0 receives after all its own sends, and on
        # NCCL a pair of ranks runs its sends and receives in order, so a send to rank 0 queued
        # before this rank's receive of the next micro-batch could wait for rank 0 forever.
        pending += [(g.send(t, dst=0), t) for t in to_rank0]
        for work, _ in pending:
            work.wait()
        if g.rank != 0:
            return None
        if not g.is_last_stage:  # rank 0 ran stage 0: the logits (and later stages' aux parts) come
            logits_parts = []  # in each sender's order: a micro-batch's aux part, then its logits
            for i, plan in enumerate(plans):
                if plan.keep_aux:
                    aux_parts[i] = self._gather_aux(aux_parts[i], len(plan.input_ids))
                out = torch.empty(len(plan.logits_indices), self.vocab_size, dtype=torch.float32, device=self.device)
                if len(plan.logits_indices):
                    g.recv(out, src=g.last_stage_leader)
                logits_parts.append(out)
        if aux_parts[0] is None:  # no EAGLE-3 head, or not kept this step
            self.aux_hidden_states = None
        else:
            self.aux_hidden_states = torch.cat(aux_parts) if len(aux_parts) > 1 else aux_parts[0]
        return torch.cat(logits_parts) if len(logits_parts) > 1 else logits_parts[0]

    def _gather_aux(self, own: torch.Tensor | None, rows: int) -> torch.Tensor | None:
        """Rank 0: one micro-batch's aux states of every stage (its own part, then each later
        stage's from that stage's first rank), laid side by side in the order the head names
        its layers."""
        model, g = self.model, self.group
        if not model.aux_layers:
            return None
        by_layer: dict[int, torch.Tensor] = {}
        for stage in range(g.pp):
            layers = model.stage_aux_layers(stage)
            if not layers:
                continue
            if stage == 0:
                part = own
            else:
                part = torch.empty(rows, len(layers) * self.hidden_size, dtype=self.dtype, device=self.device)
                g.recv(part, src=g.peer(stage))
            by_layer.update(zip(layers, part.split(self.hidden_size, dim=-1), strict=True))
        return torch.cat([by_layer[i] for i in model.aux_layers], dim=-1)
