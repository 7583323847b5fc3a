"""Mooncake Transfer Engine backend: the replica's KV tensor is registered once; a prefill
replica writes blocks straight into a decode replica's registered memory.

P2PHANDSHAKE metadata needs no etcd or metadata server: a peer is addressed as
"<host>:<rpc port>". Protocol "tcp" works everywhere; "rdma" where the NICs exist. Import
errors name the package to install (mooncake-transfer-engine-non-cuda on machines without CUDA).

Writes are asynchronous: `start_write` submits them and returns a `Transfer` that the replica
loop polls between steps, so it keeps computing while the bytes move. Each contiguous segment is
its own one-request Mooncake batch: `transfer_check_status` looks at a batch's first request only
(a 64-segment batch read "done" before its bytes had landed, 0.3.13.post1), and the calls that
wait for a whole batch spin a core until it ends. A submitted write cannot be cancelled: giving
up on one means not waiting for it, and its source blocks must stay untouched until it ends.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import torch

from workers.kvtransfer.layout import KVTransferError, block_bytes, block_segments

log = logging.getLogger(__name__)


def _engine_class():
    try:
        from mooncake.engine import TransferEngine
    except ImportError as exc:
        raise KVTransferError(
            f"Mooncake Transfer Engine is not importable ({exc}). Install mooncake-transfer-engine "
            "(CUDA machines) or mooncake-transfer-engine-non-cuda, plus Debian's libibverbs1 "
            "ibverbs-providers libnl-3-200 libnl-route-3-200 (`make setup` does this)."
        ) from exc
    return TransferEngine


def merge_runs(src: list[int], dst: list[int], size: int) -> tuple[list[int], list[int], list[int]]:
    """Coalesce segments that are adjacent on both sides into longer transfers."""
    out_src, out_dst, out_len = [], [], []
    for s, d in zip(src, dst, strict=True):
        if out_src and out_src[-1] + out_len[-1] == s and out_dst[-1] + out_len[-1] == d:
            out_len[-1] += size
        else:
            out_src.append(s)
            out_dst.append(d)
            out_len.append(size)
    return out_src, out_dst, out_len


class Transfer:
    """A write of blocks in flight, one Mooncake request per segment."""

    def __init__(self, engine, session: str, nbytes: int, nblocks: int):
        self._engine = engine
        self.session = session
        self.nbytes = nbytes
        self.nblocks = nblocks
        self.started = time.monotonic()
        self.seconds = 0.0  # submit to the last segment landed
        self.pending: deque[int] = deque()  # request ids not yet ended, in submission order
        self.error: str | None = None

    def poll(self) -> bool:
        """True once every segment has ended; then raises KVTransferError if any failed."""
        while self.pending:
            status = self._engine.transfer_check_status(self.pending[0])
            if status == 0:  # in flight
                return False
            self.pending.popleft()
            if status != 1 and self.error is None:
                why = "failed" if status == -1 else "timed out" if status == -2 else f"ended with status {status}"
                self.error = f"Mooncake write to {self.session} {why}"
        if not self.seconds:
            self.seconds = time.monotonic() - self.started
        if self.error:
            raise KVTransferError(self.error)
        return True


class MooncakeKV:
    def __init__(self, kv_cache: torch.Tensor, layout: dict, host: str = "127.0.0.1", protocol: str = "tcp"):
        if kv_cache.device.type != "cpu" and protocol == "tcp":
            log.info("TCP transfers of GPU memory go through host buffers inside Mooncake")
        self.kv = kv_cache
        self.layout = layout
        self.engine = _engine_class()()
        started = time.monotonic()
        if self.engine.initialize(host, "P2PHANDSHAKE", protocol, "") != 0:
            raise KVTransferError(f"Mooncake initialize({host!r}, P2PHANDSHAKE, {protocol!r}) failed")
        if self.engine.register_memory(kv_cache.data_ptr(), kv_cache.numel() * kv_cache.element_size()) != 0:
            raise KVTransferError("Mooncake could not register the KV cache memory")
        self.session = f"{host}:{self.engine.get_rpc_port()}"
        log.info("Mooncake %s endpoint %s ready in %.0f ms", protocol, self.session, (time.monotonic() - started) * 1e3)

    def endpoint(self) -> dict:
        """What a peer needs to write into this replica's blocks."""
        return {"session": self.session, "base": self.kv.data_ptr(), "layout": self.layout}

    def start_write(self, remote: dict, local_blocks: list[int], remote_blocks: list[int]) -> Transfer:
        """Start copying our `local_blocks` into the peer's `remote_blocks`; poll the result. A
        segment that cannot be submitted (e.g. the peer is gone) fails the transfer, which still
        ends only when the segments already submitted have."""
        if len(local_blocks) != len(remote_blocks):
            raise KVTransferError(f"{len(local_blocks)} blocks to send but {len(remote_blocks)} reserved")
        size = block_bytes(self.layout)
        src = block_segments(self.kv.data_ptr(), self.layout, local_blocks)
        dst = block_segments(remote["base"], remote["layout"], remote_blocks)
        src, dst, lengths = merge_runs(src, dst, size)
        transfer = Transfer(self.engine, remote["session"], sum(lengths), len(local_blocks))
        for s, d, n in zip(src, dst, lengths, strict=True):
            request = self.engine.transfer_submit_write(remote["session"], s, d, n)
            if request <= 0:
                transfer.error = f"Mooncake could not start a write to {remote['session']}"
                break
            transfer.pending.append(request)
        return transfer
