"""The process group of one replica: every rank joins it, then the sub-groups it computes in.

Two kinds of traffic, two timeouts:
- compute (tensor all-reduce / all-gather inside a stage, activations between stages): a
  collective that outlives `timeout_s` raises, so a dead or stuck rank fails the step;
- control (rank 0's step plans to the others, on gloo even with NCCL): the other ranks wait
  there while the replica idles, so its timeout is long; rank 0's death still shows at once,
  as a closed connection (and, offline, as the parent's death: launch.py).

Ranks meet first on rank 0's TCP store, where rank 0 waits for every rank while watching their
processes (launch.py); only then do they join, so joining (every group's connections) takes the
compute timeout: a rank that dies meanwhile fails the start within it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from workers.engine.parallel.config import ParallelConfig

CONTROL_TIMEOUT = timedelta(days=7)
# How long a rank may take to reach the store (spawn, import torch, on a loaded machine).
STARTUP_TIMEOUT = timedelta(seconds=300)


@dataclass
class RankGroup:
    parallel: ParallelConfig
    rank: int
    device: torch.device
    tp_group: object = None  # this rank's stage: its tensor-parallel peers
    world: object = None  # all ranks, the compute timeout: activations and logits between stages
    control: object = None  # all ranks, gloo, long timeout
    stage_bounds: list[tuple[int, int]] = field(default_factory=list)

    @property
    def tp(self) -> int:
        return self.parallel.tensor_parallel_size

    @property
    def pp(self) -> int:
        return self.parallel.pipeline_parallel_size

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def stage(self) -> int:
        return self.rank // self.tp

    @property
    def is_first_stage(self) -> bool:
        return self.stage == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage == self.pp - 1

    def peer(self, stage: int) -> int:
        """The rank at this rank's tensor position in `stage`."""
        return stage * self.tp + self.tp_rank

    @property
    def last_stage_leader(self) -> int:
        return (self.pp - 1) * self.tp

    # -- compute ---------------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp > 1:
            dist.all_reduce(x, group=self.tp_group)
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.tp)]
        dist.all_gather(parts, x.contiguous(), group=self.tp_group)
        return torch.cat(parts, dim=-1)

    # -- control ---------------------------------------------------------------------------
    def broadcast_command(self, command: tuple | None = None) -> tuple:
        """Rank 0 sends `command`; every other rank receives and returns it."""
        box = [command]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def gather_objects(self, obj) -> list:
        out = [None] * self.parallel.world_size
        dist.all_gather_object(out, obj, group=self.control)
        return out

    def send(self, x: torch.Tensor, dst: int):
        return dist.isend(x, dst=dst, group=self.world)

    def recv(self, x: torch.Tensor, src: int) -> None:
        dist.recv(x, src=src, group=self.world)

    def min_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control)
        return int(t.item())


def host_store(world_size: int) -> dist.TCPStore:
    """Rank 0's rendezvous store, on a free local port (`.port`). It does not wait for the other
    ranks: rank 0 waits for them itself, watching their processes (launch.py)."""
    return dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, timeout=STARTUP_TIMEOUT, wait_for_workers=False)


def connect_store(port: int) -> dist.TCPStore:
    """A rank's connection to rank 0's store."""
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=STARTUP_TIMEOUT)


def join(parallel: ParallelConfig, rank: int, store: dist.Store, device: torch.device) -> RankGroup:
    """Join the group as `rank`, once every rank has reached `store` (see the module docstring)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=parallel.timeout_s)
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=parallel.world_size,
        timeout=timeout,
        **({"device_id": device} if backend == "nccl" else {}),
    )
    group = RankGroup(parallel, rank, device)
    tp = parallel.tensor_parallel_size
    # Every rank must create every group, in the same order.
    for stage in range(parallel.pipeline_parallel_size):
        g = dist.new_group(list(range(stage * tp, (stage + 1) * tp)), timeout=timeout, backend=backend)
        if stage == group.stage:
            group.tp_group = g
    group.world = dist.new_group(list(range(parallel.world_size)), timeout=timeout, backend=backend)
    # Connected within the compute timeout too (a rank dead by then fails the start, not in a
    # week); its collectives then get the long one.
    group.control = dist.new_group(list(range(parallel.world_size)), timeout=timeout, backend="gloo")
    dist.distributed_c10d._set_pg_timeout(CONTROL_TIMEOUT, group.control)
    return group


def leave() -> None:
    if dist.is_initialized():
        with contextlib.suppress(Exception):  # a broken group cannot always be torn down politely
            dist.destroy_process_group()
