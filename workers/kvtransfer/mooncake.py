"""Mooncake Transfer Engine backend: the replica's KV tensor is registered once; a prefill
replica writes blocks straight into a decode replica's registered memory.

P2PHANDSHAKE metadata needs no etcd or metadata server: a peer is addressed as
"<host>:<rpc port>". Protocol "tcp" works everywhere; "rdma" where the NICs exist. Import
errors name the package to install (mooncake-transfer-engine-non-cuda on machines without CUDA).
"""

from __future__ import annotations

import logging
import time

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
        self.bytes_sent = 0
        self.blocks_sent = 0
        self.seconds = 0.0
        log.info("Mooncake %s endpoint %s ready in %.0f ms", protocol, self.session, (time.monotonic() - started) * 1e3)

    def endpoint(self) -> dict:
        """What a peer needs to write into this replica's blocks."""
        return {"session": self.session, "base": self.kv.data_ptr(), "layout": self.layout}

    def write_blocks(self, remote: dict, local_blocks: list[int], remote_blocks: list[int]) -> int:
        """Copy our `local_blocks` into the peer's `remote_blocks`; returns the bytes moved."""
        if len(local_blocks) != len(remote_blocks):
            raise KVTransferError(f"{len(local_blocks)} blocks to send but {len(remote_blocks)} reserved")
        size = block_bytes(self.layout)
        src = block_segments(self.kv.data_ptr(), self.layout, local_blocks)
        dst = block_segments(remote["base"], remote["layout"], remote_blocks)
        src, dst, lengths = merge_runs(src, dst, size)
        started = time.monotonic()
        if self.engine.batch_transfer_sync_write(remote["session"], src, dst, lengths) != 0:
            raise KVTransferError(f"Mooncake write to {remote['session']} failed")
        moved = sum(lengths)
        self.seconds += time.monotonic() - started
        self.bytes_sent += moved
        self.blocks_sent += len(local_blocks)
        return moved
