"""Host DRAM tier: the replica's own LRU of packed blocks, bounded by bytes.

Blocks the device cache evicts land here first (a memory copy away from reuse). What this LRU
pushes out goes to `on_evict`, called after the lock is released so that a slow spill (to disk)
never holds up other readers and writers of this tier.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from workers.kvtiers.base import KVTier

log = logging.getLogger(__name__)

Evicted = list[tuple[str, int, bytes]]


class HostTier(KVTier):
    name = "dram"

    def __init__(self, capacity_bytes: int, on_evict: Callable[[Evicted], None] | None = None):
        super().__init__()
        self.capacity_bytes = capacity_bytes
        self.on_evict = on_evict
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[int, bytes]] = OrderedDict()  # oldest first
        self._used = 0
        self.stats.capacity_bytes = capacity_bytes

    def _put_many(self, items: list[tuple[str, int, bytes]]) -> int:
        written = 0
        evicted: Evicted = []
        with self._lock:
            for key, block_hash, payload in items:
                if key in self._entries:  # same key, same content: only its recency changes
                    self._entries.move_to_end(key)
                    continue
                if len(payload) > self.capacity_bytes:
                    continue  # could never fit; the caller's other tiers may take it
                payload = bytes(payload)  # no copy when it is bytes already
                self._entries[key] = (block_hash, payload)
                self._used += len(payload)
                written += len(payload)
                while self._used > self.capacity_bytes:
                    old_key, (old_hash, old_payload) = self._entries.popitem(last=False)
                    self._used -= len(old_payload)
                    evicted.append((old_key, old_hash, old_payload))
            self.stats.used_bytes = self._used
        if evicted:
            self._count(evictions=len(evicted))
            if self.on_evict is not None:
                try:
                    self.on_evict(evicted)
                except Exception:  # the put itself succeeded; the spill is the caller's bug
                    log.exception("dram tier: on_evict failed for %d blocks", len(evicted))
        return written

    def _get_many(self, keys: list[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is not None:
                    self._entries.move_to_end(key)
                out.append(entry[1] if entry else None)
        return out

    def _exists_many(self, keys: list[str]) -> list[bool]:
        with self._lock:
            return [key in self._entries for key in keys]

    def _evict(self, keys: list[str]) -> None:
        with self._lock:
            for key in keys:
                entry = self._entries.pop(key, None)
                if entry is not None:
                    self._used -= len(entry[1])
            self.stats.used_bytes = self._used

    def keys(self) -> list[str]:
        """Held keys, least recently used first."""
        with self._lock:
            return list(self._entries)
