"""KV tiers behind the device cache: host DRAM, Mooncake Store, disk (workers/kvtiers).

What moves when:
- **Write-back on eviction.** When the block manager reuses a cached block, its K/V first goes
  to host DRAM (or, without a DRAM tier, to disk). Blocks the DRAM tier's LRU pushes out go to
  disk. Disk writes happen on a background thread; the engine only copies the bytes out.
- **Write-through-selective to the store.** The store is shared by every replica of a
  deployment, so only blocks likely to be read again go there: when a request finishes, its full
  blocks are put if the request was a session turn (the gateway saw a session key: the next turn
  starts with this context) or if its prompt hit a cache at admission (its prefix has proved
  reusable). A block this engine already put is not put again, unless that put failed or the
  store has reconnected since (a restarted master starts with an empty pool).
- **Lookup on a prefix miss.** A waiting request whose prompt continues past what the device
  cache holds looks the following blocks up in host DRAM at once (a memory copy), then, for what
  DRAM lacks, in the store and on disk on a background thread. While that load is in flight the
  request waits and others step. A load's blocks are verified (checksum, block hash, token ids)
  before they are copied into device blocks; a block that fails is a miss, counted by its tier.
  Blocks from the store or disk are used only when they cover at least `min_prefix_tokens`
  (below that, recomputing is cheaper than the round trip; docs/caching.md has the measurement).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field, fields

import torch

from workers.engine.block_manager import Block, BlockManager
from workers.engine.errors import RequestError
from workers.engine.sequence import Sequence
from workers.kvtiers import (
    DiskTier,
    HostTier,
    KVTier,
    MooncakeStoreTier,
    block_key,
    fingerprint,
    pack_block,
    unpack_block,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVTierConfig:
    """`EngineConfig.kv_tiers`, e.g. {"dram_bytes": 2 << 30, "disk_path": "/var/cache/sy",
    "disk_bytes": 100 << 30, "store_master": "10.0.0.5:50051"}. A tier is on when its size (or
    master address) is set."""

    dram_bytes: int = 0
    disk_path: str = ""
    disk_bytes: int = 0
    store_master: str = ""  # "host:port" of mooncake_master
    store_metrics: str = ""  # "host:port" of its metrics: the pool's capacity and use (optional)
    # Memory this replica lends the store. None by default: a block lives in the memory of the
    # client that holds it and goes when that process goes, so the pool belongs to segment
    # servers that outlive replicas (workers/kvtiers/master.py, docs/operations.md).
    store_segment_bytes: int = 0
    store_buffer_bytes: int = 64 << 20
    store_protocol: str = "tcp"  # "rdma" where the NICs exist
    store_device: str = ""  # RDMA device names
    local_hostname: str = "127.0.0.1"  # how other store clients reach this one
    min_prefix_tokens: int = 0  # the smallest store/disk load worth making
    timeout_s: float = 2.0  # the longest a store call may take before the store counts as down

    @classmethod
    def from_dict(cls, raw: dict | KVTierConfig | None) -> KVTierConfig | None:
        """None when no tier is on; anything unknown or inconsistent is a RequestError."""
        if raw is None or isinstance(raw, KVTierConfig):
            return raw
        if not isinstance(raw, dict):
            raise RequestError(f"kv_tiers must be a dict, got {type(raw).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise RequestError(f"kv_tiers: unknown keys {unknown}; known: {sorted(known)}")
        cfg = cls(**raw)
        for name in ("dram_bytes", "disk_bytes", "min_prefix_tokens", "store_segment_bytes", "store_buffer_bytes"):
            if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < 0:
                raise RequestError(f"kv_tiers.{name} must be a non-negative integer")
        if bool(cfg.disk_path) != bool(cfg.disk_bytes):
            raise RequestError("kv_tiers: a disk tier needs both disk_path and disk_bytes")
        if not (cfg.dram_bytes or cfg.disk_bytes or cfg.store_master):
            return None
        return cfg


@dataclass
class FetchedBlock:
    """A verified block from a tier, waiting to be copied into a device block."""

    index: int
    hash: int
    token_ids: tuple[int, ...]
    data: memoryview
    tier: str
    used: bool = False  # copied into a device block at admission


@dataclass
class Fetch:
    """A waiting sequence's tier lookup: blocks found in DRAM at once, and the slower tiers'
    answer (`future`) while it is in flight."""

    blocks: list[FetchedBlock] = field(default_factory=list)
    future: concurrent.futures.Future | None = None


class TieredCache:
    def __init__(self, cfg: KVTierConfig, kv_cache: torch.Tensor, layout: dict, block_size: int):
        self.cfg = cfg
        self.kv_cache = kv_cache  # [layers, 2, blocks, block_size, kv_heads, head_dim]
        self.block_size = block_size
        self.fp = fingerprint(layout)
        self.disk = DiskTier(cfg.disk_path, cfg.disk_bytes) if cfg.disk_bytes else None
        self.host = HostTier(cfg.dram_bytes, on_evict=self._spill) if cfg.dram_bytes else None
        self.store = (
            MooncakeStoreTier(
                cfg.store_master,
                local_hostname=cfg.local_hostname,
                segment_bytes=cfg.store_segment_bytes,
                buffer_bytes=cfg.store_buffer_bytes,
                protocol=cfg.store_protocol,
                device_name=cfg.store_device,
                timeout_s=cfg.timeout_s,
                metrics_address=cfg.store_metrics,
            )
            if cfg.store_master
            else None
        )
        # Slower tiers in lookup order (DRAM is looked up on the engine's thread).
        self.remote: list[KVTier] = [t for t in (self.store, self.disk) if t is not None]
        self.fetches: dict[Sequence, Fetch] = {}
        self._loader = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="kv-tier-load")
        # Puts to the store and disk, in order, off the engine's thread. Bounded: when a tier is
        # slower than the traffic, puts are dropped (counted), never waited for.
        self._writes: queue.Queue = queue.Queue(maxsize=256)
        self._writer = threading.Thread(target=self._write_loop, name="kv-tier-write", daemon=True)
        self._writer.start()
        # Hashes this engine put (or queued) since the store last connected; bounded. Touched by
        # the engine's thread and the writer's.
        self._in_store: OrderedDict[int, None] = OrderedDict()
        self._in_store_lock = threading.Lock()
        self._in_store_epoch = 0  # the store's `epoch` when _in_store was started
        self.blocks_loaded = {"dram": 0, "store": 0, "disk": 0}  # blocks used by admissions
        self.load_seconds = 0.0
        self.dropped_writes = 0

    @property
    def tiers(self) -> list[KVTier]:
        return [t for t in (self.host, self.store, self.disk) if t is not None]

    # -- bytes in and out of device blocks ------------------------------------------------------
    def _block_bytes(self, block_id: int) -> bytes:
        t = self.kv_cache[:, :, block_id].contiguous()
        return t.view(torch.uint8).cpu().numpy().tobytes()

    def write_block(self, block_id: int, block: FetchedBlock) -> None:
        """Copy a fetched block's K/V into device block `block_id` (the block manager calls this
        while the block joins the prefix cache)."""
        dst = self.kv_cache[:, :, block_id]
        with warnings.catch_warnings():  # the payload is read-only; it is only read here
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            src = torch.frombuffer(block.data, dtype=torch.uint8)
        dst.copy_(src.view(self.kv_cache.dtype).view(dst.shape))
        block.used = True
        self.blocks_loaded[block.tier] += 1

    def _payload(self, block: Block | tuple[int, int, tuple[int, ...]]) -> tuple[str, int, bytes]:
        bid, h, tokens = (block.block_id, block.hash, block.token_ids) if isinstance(block, Block) else block
        return block_key(self.fp, h), h, pack_block(h, tokens, self._block_bytes(bid))

    # -- write paths ----------------------------------------------------------------------------
    def on_evict(self, block: Block) -> None:
        """The block manager is about to reuse a cached block: keep its K/V in a lower tier."""
        if self.host is not None:
            self.host.put_many([self._payload(block)])
        elif self.disk is not None:
            self._enqueue(self.disk, [self._payload(block)])

    def _spill(self, items: list[tuple[str, int, bytes]]) -> None:
        """DRAM's LRU pushed these out: they go to disk, if there is one."""
        if self.disk is not None:
            self._enqueue(self.disk, items)

    def on_finish(self, seq: Sequence) -> None:
        """`seq` finished with its blocks still in place: put the full ones in the store when
        the rule in the module docstring says they will be read again."""
        if self.store is None or not (seq.session_turn or seq.num_cached_tokens > 0):
            return
        if not self.store.stats.available:  # the put would be refused: skip copying the blocks out
            return
        todo = []
        with self._in_store_lock:
            if self._in_store_epoch != self.store.epoch:  # what was put may be gone
                self._in_store.clear()
                self._in_store_epoch = self.store.epoch
            for i, (bid, h) in enumerate(zip(seq.block_table, seq.block_hashes, strict=False)):
                if h in self._in_store:
                    self._in_store.move_to_end(h)
                    continue
                todo.append((bid, h, self._tokens_of(seq.token_ids, i)))
                self._in_store[h] = None
            while len(self._in_store) > 1 << 20:
                self._in_store.popitem(last=False)
        items = [self._payload(block) for block in todo]  # copies out of the device, unlocked
        if items and not self._enqueue(self.store, items):
            self._not_in_store(items)

    def _not_in_store(self, items: list[tuple[str, int, bytes]]) -> None:
        """A put of these was dropped or failed: a later finish puts them again."""
        with self._in_store_lock:
            for _, h, _ in items:
                self._in_store.pop(h, None)

    def _tokens_of(self, token_ids: list[int], index: int) -> tuple[int, ...]:
        bs = self.block_size
        return tuple(token_ids[index * bs : (index + 1) * bs])

    def _enqueue(self, tier: KVTier, items: list) -> bool:
        try:
            self._writes.put_nowait((tier, items))
        except queue.Full:
            self.dropped_writes += len(items)
            return False
        return True

    def _write_loop(self) -> None:
        while True:
            job = self._writes.get()
            try:
                if job is None:
                    return
                tier, items = job
                if not tier.put_many(items) and tier is self.store:
                    self._not_in_store(items)
            except Exception:  # a tier must never take the writer down with it
                log.exception("writing %d blocks to the %s tier failed", len(items), tier.name)
            finally:
                self._writes.task_done()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued write reached its tier (benchmarks and tests; a replica
        never waits). False if `timeout` passed first."""
        deadline = time.monotonic() + timeout
        while self._writes.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    # -- lookup on a prefix miss ----------------------------------------------------------------
    def ready(self, seq: Sequence, bm: BlockManager) -> bool:
        """Whether waiting `seq` can be admitted now: its tier lookup is done (or was not
        needed). The first call starts the lookup of the blocks after those the device cache
        holds."""
        fetch = self.fetches.get(seq)
        if fetch is None:
            fetch = self.fetches[seq] = Fetch()
            device_blocks, max_blocks = bm.cached_prefix_blocks(seq), bm.max_prefix_blocks(seq)
            if device_blocks >= max_blocks:
                return True
            hashes = seq.prefix_hashes(self.block_size)[:max_blocks]
            tokens = [self._tokens_of(seq.token_ids, i) for i in range(max_blocks)]
            fetch.blocks = self._from_host(device_blocks, hashes, tokens)
            start = device_blocks + len(fetch.blocks)
            if self.remote and start < max_blocks:
                fetch.future = self._loader.submit(self._from_remote, start, hashes, tokens)
        if fetch.future is not None:
            if not fetch.future.done():
                return False
            remote = fetch.future.result()
            fetch.future = None
            if len(remote) * self.block_size >= self.cfg.min_prefix_tokens:
                fetch.blocks.extend(remote)
        return True

    def loaded_blocks(self, seq: Sequence) -> list[FetchedBlock]:
        """The blocks `seq`'s finished lookup found (for BlockManager.allocate)."""
        fetch = self.fetches.get(seq)
        return fetch.blocks if fetch else []

    def admitted(self, seq: Sequence) -> None:
        """`seq` was admitted: record how many of its prompt tokens each tier served
        (`seq.tier_cached_tokens`) and drop its lookup."""
        fetch = self.fetches.pop(seq, None)
        if fetch is None or seq.num_preemptions:  # counted at its first admission only
            return
        for block in fetch.blocks:
            if block.used:
                seq.tier_cached_tokens[block.tier] = seq.tier_cached_tokens.get(block.tier, 0) + self.block_size

    def forget(self, seq: Sequence) -> None:
        """`seq` left the queue unadmitted (aborted): drop its lookup; a load still in flight
        finishes on its thread and is thrown away."""
        self.fetches.pop(seq, None)

    def loading(self) -> bool:
        return any(f.future is not None for f in self.fetches.values())

    def wait(self, timeout: float) -> None:
        """Block up to `timeout` for a load to finish (the engine has nothing else to run)."""
        futures = [f.future for f in self.fetches.values() if f.future is not None]
        if futures:
            concurrent.futures.wait(futures, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)

    def _from_host(self, start: int, hashes: list[int], tokens: list[tuple]) -> list[FetchedBlock]:
        if self.host is None:
            return []
        payloads = self.host.get_many([block_key(self.fp, h) for h in hashes[start:]], hashes[start:])
        return self._contiguous(start, payloads, hashes, tokens, "dram")

    def _from_remote(self, start: int, hashes: list[int], tokens: list[tuple]) -> list[FetchedBlock]:
        """On a loader thread: the longest run of blocks from `start` that the store, then disk,
        hold, verified."""
        started = time.perf_counter()
        found: list[FetchedBlock] = []
        for tier in self.remote:
            i = start + len(found)
            if i == len(hashes):
                break
            payloads = tier.get_many([block_key(self.fp, h) for h in hashes[i:]], hashes[i:])
            found.extend(self._contiguous(i, payloads, hashes, tokens, tier.name))
        self.load_seconds += time.perf_counter() - started
        return found

    @staticmethod
    def _contiguous(
        start: int, payloads: list, hashes: list[int], tokens: list[tuple], tier: str
    ) -> list[FetchedBlock]:
        """Verified blocks from `start` up to the first miss or token mismatch."""
        out = []
        for offset, payload in enumerate(payloads):
            i = start + offset
            if payload is None:
                break
            # KVTier.get_many returned it verified (checksum and hash): only parse it here.
            block_tokens, data = unpack_block(payload, hashes[i], checksum=False)
            if block_tokens != tokens[i]:  # a hash collision: never use it
                break
            out.append(FetchedBlock(i, hashes[i], block_tokens, data, tier))
        return out

    # -- introspection --------------------------------------------------------------------------
    def stats(self) -> dict:
        return {
            "tiers": {t.name: t.stats.as_dict() for t in self.tiers},
            "blocks_loaded": dict(self.blocks_loaded),
            "load_seconds": self.load_seconds,
            "dropped_writes": self.dropped_writes,
            "loads_inflight": sum(1 for f in self.fetches.values() if f.future is not None),
        }

    def close(self) -> None:
        self._writes.put(None)
        self._writer.join(timeout=5)
        self._loader.shutdown(wait=False, cancel_futures=True)
        for tier in self.tiers:
            tier.close()
