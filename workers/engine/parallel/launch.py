"""Starting a group: rank 0 (the engine's own process) spawns ranks 1.. and joins them.

Offline (`LLM(..., tensor_parallel_size=2)`) rank 0 spawns the other ranks with
multiprocessing's spawn start method, on a free local port. Each rank loads its shard, sizes
its KV cache (the group takes the smallest count, so block ids mean the same everywhere), then
serves rank 0's commands until told to stop. A rank whose parent dies exits at once (Linux
parent-death signal), so killing rank 0 leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing as mp
import os
import signal
import socket
import time
import traceback
from dataclasses import dataclass

import torch

from workers.engine.config import MLA_ARCHITECTURES, EngineConfig, ModelConfig
from workers.engine.memory import rank_memory
from workers.engine.model_runner import kv_bytes_per_block, num_kv_blocks
from workers.engine.parallel import group as pgroup
from workers.engine.parallel.config import ParallelConfig, ParallelError
from workers.engine.parallel.deepseek import DeepseekStage
from workers.engine.parallel.model import LlamaStage
from workers.engine.parallel.runner import ParallelRunner
from workers.kvtransfer import ranks as kv_ranks

log = logging.getLogger(__name__)


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def rank_device(device: torch.device, rank: int) -> torch.device:
    """CPU ranks share the CPU; CUDA rank r takes the r-th visible device (the agent narrows
    CUDA_VISIBLE_DEVICES to the replica's devices)."""
    return torch.device("cuda", rank) if device.type == "cuda" else torch.device("cpu")


def _set_threads(parallel: ParallelConfig, device: torch.device) -> None:
    if device.type == "cpu":
        torch.set_num_threads(parallel.threads_per_rank or max(1, (os.cpu_count() or 1) // parallel.world_size))


@dataclass
class RankState:
    """What `build_rank` gives each rank: its group, model, runner and memory figures."""

    group: pgroup.RankGroup
    model: torch.nn.Module
    runner: ParallelRunner
    num_blocks: int
    kv: object = None  # its KV transfer engine, once rank 0 opened them (kvtransfer/ranks.py)

    def memory(self) -> dict:
        return rank_memory(self.group.rank, self.model, self.runner.kv_cache, self.group.device)

    def kv_layout(self) -> dict:
        """This rank's KV tensor as a peer rank must match it."""
        return {**self.runner.kv_description(), **self.group.parallel.rank_fields(self.group.rank)}


def build_rank(
    engine: EngineConfig,
    cfg: ModelConfig,
    parallel: ParallelConfig,
    rank: int,
    port: int,
    dtype: torch.dtype,
    aux_layers: tuple[int, ...] = (),
    draft_embedding: bool = False,
) -> RankState:
    """This rank's stage, KV cache and runner. `aux_layers`: the layers an EAGLE-3 head on rank 0
    reads (every stage keeps those it holds); `draft_embedding` (rank 0): the head shares the
    target's embedding, whose whole table is made ready before the KV cache is sized."""
    device = rank_device(torch.device(engine.device), rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    group = pgroup.join(parallel, rank, "127.0.0.1", port, device)
    group.stage_bounds = parallel.stage_layers(cfg.num_layers)
    stage = DeepseekStage if cfg.architecture in MLA_ARCHITECTURES else LlamaStage  # MLA + MoE, or dense
    model = stage.load(engine.model, cfg, group, dtype)
    if aux_layers:
        model.capture_aux_hidden_states(aux_layers)
    if draft_embedding:
        model.draft_embedding()
    if engine.num_kv_blocks:
        blocks = engine.num_kv_blocks
    else:
        # The CPU budget is per rank; each rank's blocks are smaller (its heads, its layers).
        per_block = kv_bytes_per_block(model.local, engine.block_size, dtype)
        blocks = (
            num_kv_blocks(engine, model.local, device, dtype)
            if device.type == "cuda"
            else engine.kv_cache_bytes // per_block
        )
    blocks = group.min_int(blocks)
    runner = ParallelRunner(model, model.local, engine, device, dtype, blocks, group)
    return RankState(group, model, runner, blocks)


def worker_main(
    engine: EngineConfig, cfg: ModelConfig, parallel: ParallelConfig, rank: int, port: int, dtype, aux_layers=()
) -> None:
    """A rank other than 0: load, then run each step rank 0 plans until "stop"."""
    with contextlib.suppress(OSError):  # die with the parent (Linux): no rank outlives rank 0
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    _set_threads(parallel, torch.device(engine.device))
    state = None
    try:
        state = build_rank(engine, cfg, parallel, rank, port, dtype, aux_layers)
        while True:
            command = state.group.broadcast_command()
            kind = command[0]
            if kind == "step":
                state.runner.run_stage(command[1])
            elif kind == "memory":
                state.group.gather_objects(state.memory())
            elif kind == "kv":
                state.group.gather_objects(kv_ranks.serve(state, command[1], command[2]))
            elif kind == "stop":
                break
    except Exception:
        log.error("rank %d failed:\n%s", rank, traceback.format_exc())
        os._exit(1)
    finally:
        pgroup.leave()


class ParallelGroup:
    """Rank 0's handle on the group: the ranks' processes, and rank 0's own state."""

    def __init__(
        self,
        engine: EngineConfig,
        cfg: ModelConfig,
        parallel: ParallelConfig,
        dtype: torch.dtype,
        aux_layers: tuple[int, ...] = (),
        draft_embedding: bool = False,
    ):
        """`aux_layers`, `draft_embedding`: for an EAGLE-3 head on rank 0 (see build_rank)."""
        if torch.distributed.is_initialized():
            raise ParallelError("this process already runs a parallel group; close that engine first")
        self.parallel = parallel
        self._threads = torch.get_num_threads()
        _set_threads(parallel, torch.device(engine.device))
        port = free_port()
        ctx = mp.get_context("spawn")
        self.processes = [
            ctx.Process(
                target=worker_main,
                args=(engine, cfg, parallel, rank, port, dtype, aux_layers),
                name=f"rank-{rank}",
                daemon=True,
            )
            for rank in range(1, parallel.world_size)
        ]
        for p in self.processes:
            p.start()
        self.closed = False
        try:
            self.state = build_rank(engine, cfg, parallel, 0, port, dtype, aux_layers, draft_embedding)
        except Exception as exc:
            dead = self._dead()  # before close kills the rest: a rank that died first is the cause
            self.close(kill=True)
            raise ParallelError(f"the parallel group did not start: {dead or exc}") from exc

    @property
    def runner(self) -> ParallelRunner:
        return self.state.runner

    @property
    def aux_hidden_states(self):
        """The last step's states for an EAGLE-3 head (rank 0's stage; see ParallelRunner)."""
        return self.state.runner.aux_hidden_states

    @property
    def kv_cache(self) -> torch.Tensor:
        return self.state.runner.kv_cache

    @property
    def num_blocks(self) -> int:
        return self.state.num_blocks

    def _dead(self) -> str:
        dead = [
            f"rank {i + 1} (pid {p.pid}) exited with code {p.exitcode}"
            for i, p in enumerate(self.processes)
            if not p.is_alive()
        ]
        return "; ".join(dead)

    def check(self) -> None:
        """Before a step: a rank that died between steps fails the group now."""
        if self.closed:
            raise ParallelError("the parallel group is closed")
        dead = self._dead()
        if dead:
            self.close(kill=True)
            raise ParallelError(f"a rank of the parallel group died: {dead}")

    def execute(self, batch, keep_aux: bool = True):
        self.check()
        try:
            return self.runner.execute(batch, keep_aux)
        except Exception as exc:
            # Give a dying rank a moment to be seen dead, to name it; then no rank is kept.
            deadline = time.monotonic() + 1.0
            while not self._dead() and time.monotonic() < deadline:
                time.sleep(0.05)
            reason = self._dead() or f"{type(exc).__name__}: {exc}"
            self.close(kill=True)
            raise ParallelError(f"the parallel group failed during a step: {reason}") from exc

    def memory(self) -> list[dict]:
        """Each rank's memory figures, by rank."""
        self.check()
        self.state.group.broadcast_command(("memory",))
        return self.state.group.gather_objects(self.state.memory())

    def kv_command(self, op: str, args=None) -> list[dict]:
        """Every rank's answer to a KV transfer command (kvtransfer/ranks.py), by rank. A rank
        that died, or a broken group, fails the group (ParallelError), as a step would."""
        self.check()
        try:
            self.state.group.broadcast_command(("kv", op, args))
            return self.state.group.gather_objects(kv_ranks.serve(self.state, op, args))
        except Exception as exc:
            reason = self._dead() or f"{type(exc).__name__}: {exc}"
            self.close(kill=True)
            raise ParallelError(f"the parallel group failed during a KV transfer: {reason}") from exc

    def close(self, kill: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        if not kill:
            try:
                self.state.group.broadcast_command(("stop",))
            except Exception:
                kill = True
        for p in self.processes:
            p.join(timeout=0 if kill else 10)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
        pgroup.leave()
        torch.set_num_threads(self._threads)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]
