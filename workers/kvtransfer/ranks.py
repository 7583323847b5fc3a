"""KV transfer for a tensor/pipeline-parallel replica: every rank moves its own shard.

A parallel replica's KV cache is one tensor per rank (its KV heads, its stage's layers), with
the same block count and so the same block ids on every rank (parallel/launch.py). A prefill
group and a decode group of the same shape therefore exchange blocks rank to rank: prefill rank
r writes its shard of the blocks into decode rank r's reserved blocks, over its own Mooncake
engine, all ranks at once (with TP each moves 1/tp of the bytes).

Rank 0 (the replica loop, `GroupKV`) drives the others over the group's control channel
(`ParallelGroup.kv_command`: one broadcast, one gather), with three commands every rank answers
through `serve`: "open" (register the rank's KV tensor, answer its endpoint and layout), "write"
(start the rank's share) and "poll" (has it ended?). A `GroupTransfer` ends when every rank's
share has; it fails, naming the ranks, if any failed, and never before every submitted segment
has ended (the source blocks must stay untouched until then). The decode group gets no command:
the writes land in its ranks' registered memory, and its rank 0 admits the request when the
prefill side reports that every rank's write has ended.
"""

from __future__ import annotations

import time

from workers.kvtransfer.layout import KVTransferError
from workers.kvtransfer.mooncake import MooncakeKV, Transfer


class RankKV:
    """One rank's Mooncake engine over its KV shard, and its writes in flight by id."""

    def __init__(self, kv_cache, layout: dict, host: str, protocol: str):
        self.kv = MooncakeKV(kv_cache, layout, host, protocol)
        self.writes: dict[int, Transfer] = {}

    def write(self, write_id: int, remote: dict, local: list[int], blocks: list[int]) -> dict:
        try:
            transfer = self.kv.start_write(remote, local, blocks)
        except KVTransferError as exc:
            return {"error": str(exc), "bytes": 0}
        self.writes[write_id] = transfer
        return {"error": None, "bytes": transfer.nbytes}

    def poll(self, write_id: int) -> dict:
        """Ended (or never started here: nothing of it in flight), and how."""
        transfer = self.writes.get(write_id)
        if transfer is None:
            return {"ended": True, "error": None}
        try:
            if not transfer.poll():
                return {"ended": False, "error": None}
        except Exception as exc:  # KVTransferError, or the engine itself failing: over either way
            del self.writes[write_id]
            return {"ended": True, "error": str(exc)}
        del self.writes[write_id]
        return {"ended": True, "error": None}


def serve(state, op: str, args) -> dict:
    """One rank's answer to a KV command (`state`: its launch.RankState). Never raises: a rank
    that raised would leave the group; a failure is the answer, and rank 0 decides."""
    try:
        if op == "open":
            host, protocol = args
            state.kv = RankKV(state.runner.kv_cache, state.kv_layout(), host, protocol)
            return {"endpoint": state.kv.kv.endpoint()}
        if state.kv is None:
            return {"error": "this rank's KV transfer engine is not open", "ended": True}
        if op == "write":
            write_id, ranks, local, blocks = args
            return state.kv.write(write_id, ranks[state.group.rank], local, blocks)
        if op == "poll":
            return state.kv.poll(args)
        return {"error": f"unknown KV command {op!r}", "ended": True}
    except Exception as exc:  # e.g. Mooncake missing on one rank's machine
        return {"error": f"{type(exc).__name__}: {exc}", "ended": True}


def _failures(answers: list[dict]) -> dict[int, str]:
    return {rank: a["error"] for rank, a in enumerate(answers) if a.get("error")}


class GroupTransfer:
    """A write of every rank's share of some blocks; the `mooncake.Transfer` interface."""

    def __init__(self, group, write_id: int, answers: list[dict], nblocks: int):
        self.group = group
        self.write_id = write_id
        self.nbytes = sum(int(a.get("bytes") or 0) for a in answers)
        self.nblocks = nblocks
        self.started = time.monotonic()
        self.seconds = 0.0
        self.errors = _failures(answers)
        self.ended = False

    def poll(self) -> bool:
        """True once every rank's share has ended; then raises KVTransferError if any failed."""
        if not self.ended:
            answers = self.group.kv_command("poll", self.write_id)
            for rank, error in _failures(answers).items():
                self.errors.setdefault(rank, error)
            if not all(a.get("ended", True) for a in answers):
                return False
            self.ended = True
            self.seconds = time.monotonic() - self.started
        if self.errors:
            raise KVTransferError("; ".join(f"rank {rank}: {error}" for rank, error in sorted(self.errors.items())))
        return True


class GroupKV:
    """Rank 0's handle on its group's transfer engines: `mooncake.MooncakeKV`'s interface
    (`endpoint`, `start_write`) for a whole parallel replica."""

    def __init__(self, group, host: str = "127.0.0.1", protocol: str = "tcp"):
        self.group = group  # launch.ParallelGroup
        answers = group.kv_command("open", (host, protocol))
        failed = _failures(answers)
        if failed:
            raise KVTransferError("; ".join(f"rank {rank}: {error}" for rank, error in sorted(failed.items())))
        self.ranks = [a["endpoint"] for a in answers]
        self._writes = 0

    @property
    def session(self) -> str:
        """Rank 0's Mooncake address (the replica's, as its heartbeat shows it)."""
        return self.ranks[0]["session"]

    def endpoint(self) -> dict:
        """Rank 0's endpoint (what a single-device peer would read), with every rank's."""
        return {**self.ranks[0], "ranks": self.ranks}

    def start_write(self, remote: dict, local_blocks: list[int], remote_blocks: list[int]) -> GroupTransfer:
        ranks = remote.get("ranks") or []
        if len(ranks) != len(self.ranks):
            raise KVTransferError(f"this replica has {len(self.ranks)} ranks, the peer {len(ranks) or 1}")
        if len(local_blocks) != len(remote_blocks):
            raise KVTransferError(f"{len(local_blocks)} blocks to send but {len(remote_blocks)} reserved")
        self._writes += 1
        answers = self.group.kv_command("write", (self._writes, ranks, list(local_blocks), list(remote_blocks)))
        return GroupTransfer(self.group, self._writes, answers, len(local_blocks))
