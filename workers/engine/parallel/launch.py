"""Starting a group: rank 0 (the engine's own process) spawns ranks 1.. and joins them.

Offline (`LLM(..., tensor_parallel_size=2)`) rank 0 spawns the other ranks with
multiprocessing's spawn start method; they meet on rank 0's TCP store. Each rank loads its
shard, sizes its KV cache (the group takes the smallest count, so block ids mean the same
everywhere), then serves rank 0's commands until told to stop. A rank whose parent dies exits
at once (Linux parent-death signal), so killing rank 0 leaves nothing behind.

Starting, rank 0 waits for the others twice: until every rank has reached the store ("joined")
and until every rank has loaded ("loaded"). It waits on their processes as well, so a rank that
exits (killed, failed to load, or a script without a main guard: see MAIN_GUARD) fails the
start at once, naming the rank, its exit code and, from its report file, why.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import shutil
import signal
import tempfile
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from workers.engine.config import EngineConfig, ModelConfig
from workers.engine.memory import rank_memory
from workers.engine.model_runner import kv_bytes_per_block, num_kv_blocks
from workers.engine.parallel import group as pgroup
from workers.engine.parallel.config import ParallelConfig, ParallelError
from workers.engine.parallel.deepseek import DeepseekStage
from workers.engine.parallel.model import LlamaStage
from workers.engine.parallel.runner import ParallelRunner
from workers.kvtransfer import ranks as kv_ranks
from workers.protocol.architectures import MLA_ARCHITECTURES

log = logging.getLogger(__name__)


# Where a rank writes why it failed (a file named by its pid), for rank 0's error: rank 0
# sees only an exit code otherwise. An environment variable, because a rank can fail before
# it has its arguments (while spawn imports the main script).
REPORTS_ENV = "SWITCHYARD_RANK_REPORTS"

MAIN_GUARD = (
    'the script that makes the LLM does so when imported, outside `if __name__ == "__main__":`; '
    "each rank is a new Python process (multiprocessing's spawn) that imports that script again, "
    "and so would start another LLM. Put the code that makes and uses the LLM under "
    '`if __name__ == "__main__":`'
)


def report_failure(message: str) -> None:
    """Leave rank 0 this rank's reason for failing (see REPORTS_ENV)."""
    folder = os.environ.get(REPORTS_ENV)
    if folder:
        with contextlib.suppress(OSError):
            Path(folder, str(os.getpid())).write_text(message)


def rank_device(device: torch.device, rank: int) -> torch.device:
    """CPU ranks share the CPU; CUDA rank r takes the r-th visible device (the agent narrows
    CUDA_VISIBLE_DEVICES to the replica's devices)."""
    return torch.device("cuda", rank) if device.type == "cuda" else torch.device("cpu")


def _set_threads(parallel: ParallelConfig, device: torch.device) -> None:
    if device.type == "cpu":
        torch.set_num_threads(parallel.threads_per_rank or max(1, (os.cpu_count() or 1) // parallel.world_size))


def stage_class(architecture: str):
    """The sharded stage that builds a rank's share of `architecture`: MLA + MoE, or dense."""
    return DeepseekStage if architecture in MLA_ARCHITECTURES else LlamaStage


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
    store: dist.Store,
    reached: Callable[[str], None],
    dtype: torch.dtype,
    aux_layers: tuple[int, ...] = (),
    draft_embedding: bool = False,
) -> RankState:
    """This rank's stage, KV cache and runner. `reached(phase)`: this rank got to "joined" or
    "loaded" (module docstring). `aux_layers`: the layers an EAGLE-3 head on rank 0 reads (every
    stage keeps those it holds); `draft_embedding` (rank 0): the head shares the target's
    embedding, whose whole table is made ready before the KV cache is sized."""
    device = rank_device(torch.device(engine.device), rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    reached("joined")
    group = pgroup.join(parallel, rank, store, device)
    group.stage_bounds = parallel.stage_layers(cfg.num_layers)
    model = stage_class(cfg.architecture).load(engine.model, cfg, group, dtype)
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
    reached("loaded")  # a rank that failed to load is named now, not seen as a broken collective
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
        store = pgroup.connect_store(port)
        steps = dist.PrefixStore("startup", store)

        def reached(phase: str) -> None:
            steps.set(f"{phase}/{rank}", "")
            if phase == "joined":  # join only once rank 0 has seen every rank here (group.py)
                steps.wait(["joined/0"])

        state = build_rank(engine, cfg, parallel, rank, store, reached, dtype, aux_layers)
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
    except Exception as exc:
        log.error("rank %d failed:\n%s", rank, traceback.format_exc())
        report_failure(f"{type(exc).__name__}: {exc}")
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
        if getattr(mp.current_process(), "_inheriting", False):
            # This process is a rank being spawned, importing the main script again (the test
            # multiprocessing itself makes before refusing to start a process).
            report_failure(MAIN_GUARD)
            raise ParallelError(MAIN_GUARD)
        if torch.distributed.is_initialized():
            raise ParallelError(
                "this process already runs a parallel group, and runs one at a time: close the LLM that "
                "started it first, with `llm.close()`, or make it with `with LLM(...) as llm:` so that it "
                "closes at the end of the block (`del llm` does not stop its ranks)"
            )
        self.parallel = parallel
        self.processes: list[mp.process.BaseProcess] = []
        self.closed = False
        self._threads = torch.get_num_threads()
        self._reports = tempfile.mkdtemp(prefix="switchyard-ranks-")
        self._remove_reports = weakref.finalize(self, shutil.rmtree, self._reports, ignore_errors=True)
        _set_threads(parallel, torch.device(engine.device))
        try:
            store = pgroup.host_store(parallel.world_size)
            self._steps = dist.PrefixStore("startup", store)
            ctx = mp.get_context("spawn")
            self.processes = [
                ctx.Process(
                    target=worker_main,
                    args=(engine, cfg, parallel, rank, store.port, dtype, aux_layers),
                    name=f"rank-{rank}",
                    daemon=True,
                )
                for rank in range(1, parallel.world_size)
            ]
            self._start_processes()
            self.state = build_rank(engine, cfg, parallel, 0, store, self._reached, dtype, aux_layers, draft_embedding)
        except BaseException as exc:
            dead = self._dead_within(1.0)  # before close kills the rest: a rank that died first is the cause
            self.close(kill=True)
            if not isinstance(exc, Exception):
                raise
            raise ParallelError(f"the parallel group did not start: {dead or exc}") from exc

    def _start_processes(self) -> None:
        previous = os.environ.get(REPORTS_ENV)
        os.environ[REPORTS_ENV] = self._reports  # the ranks inherit it when spawned
        try:
            for p in self.processes:
                p.start()
        finally:
            if previous is None:
                del os.environ[REPORTS_ENV]
            else:
                os.environ[REPORTS_ENV] = previous

    def _reached(self, phase: str) -> None:
        """Rank 0 at `phase`: wait until every rank is there too. A rank that exits meanwhile fails
        the start at once (its process's sentinel wakes the wait); one that does not reach the
        store within STARTUP_TIMEOUT does too. Loading has no deadline: its length is the model's."""
        ranks = range(1, self.parallel.world_size)
        deadline = time.monotonic() + pgroup.STARTUP_TIMEOUT.total_seconds() if phase == "joined" else None
        sentinels = [p.sentinel for p in self.processes]
        while not self._steps.check([f"{phase}/{rank}" for rank in ranks]):
            dead = self._dead()
            if dead:
                raise ParallelError(dead)
            if deadline is not None and time.monotonic() > deadline:
                late = [str(rank) for rank in ranks if not self._steps.check([f"{phase}/{rank}"])]
                seconds = pgroup.STARTUP_TIMEOUT.total_seconds()
                raise ParallelError(f"rank {', '.join(late)} did not start within {seconds:.0f} s")
            mp.connection.wait(sentinels, timeout=0.1)
        self._steps.set(f"{phase}/0", "")

    @property
    def runner(self) -> ParallelRunner:
        return self.state.runner

    @property
    def model(self):
        """Rank 0's stage of the model (the executor interface: executor.py)."""
        return self.state.model

    def kv_description(self) -> dict:
        """Rank 0's KV tensor as a peer must know it; each rank's own comes with the group's
        transfer endpoint (kvtransfer/ranks.py)."""
        return self.runner.kv_description()

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
        """Each rank that exited: its exit code and, if it left one, its report."""
        dead = []
        for rank, p in enumerate(self.processes, start=1):
            if p.pid is None or p.is_alive():
                continue
            how = f"rank {rank} (pid {p.pid}) exited with code {p.exitcode}"
            if p.exitcode < 0:
                with contextlib.suppress(ValueError):
                    how += f" ({signal.Signals(-p.exitcode).name})"
            with contextlib.suppress(OSError):
                how += ": " + Path(self._reports, str(p.pid)).read_text()
            dead.append(how)
        return "; ".join(dead)

    def _dead_within(self, seconds: float) -> str:
        """`_dead()`, giving a rank that is dying (its connections already closed) `seconds` to
        exit, so that the error names it; returns as soon as one has."""
        deadline = time.monotonic() + seconds
        sentinels = [p.sentinel for p in self.processes if p.pid is not None]
        while not (dead := self._dead()) and (left := deadline - time.monotonic()) > 0:
            mp.connection.wait(sentinels, timeout=left)
        return dead

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
            reason = self._dead_within(1.0) or f"{type(exc).__name__}: {exc}"
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
            if p.pid is None:  # never started: the start failed before it
                continue
            p.join(timeout=0 if kill else 10)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
        pgroup.leave()
        torch.set_num_threads(self._threads)
        self._remove_reports()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]
