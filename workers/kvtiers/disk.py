"""Disk tier: one file per block in a directory per node, shared by the node's replicas.

A block lives in `<path>/<key>.kvb`, written to a temporary file and `os.replace`d, so a reader
sees a whole file or none. Reads take no lock (an open file survives its eviction) and verify the
checksum like every tier's; a hit sets the file's mtime, and eviction is LRU by mtime, so every
process sees every other's recency.

Fsync policy: none. The tier is a cache: a crashed machine may come back with recent files
missing or holding wrong bytes; the first read of such a file fails its checksum, counts as a
miss and removes it. Syncing each block would cost a disk flush per block for nothing a
recompute cannot restore.

The byte budget holds across the processes that share the directory. Every change to it (a
write, an eviction, a removal) is made under an exclusive `flock` on `<path>/.lock`, and that
file holds the ledger: the bytes the blocks use and a generation bumped by every change. A writer
makes room, then reserves its bytes in the ledger, then writes; so the files never add up to more
than the ledger, nor the ledger to more than the capacity. Each process keeps an LRU index of the
files, exact while the ledger's generation is the one this process last wrote; when another
process has changed the directory since, and room must be made, the index is rebuilt from a
directory scan, and the eviction then frees an extra 1/32 of the capacity so that replicas
writing in turn do not scan on every write. A process that dies mid-write leaves the ledger
counting bytes it never wrote (never fewer than are there); the next scan corrects it. The
processes sharing a directory should give it the same capacity (each enforces its own).

At start the tier adopts the files it finds (a restarted replica finds its blocks) and removes
temporary files of writers that died.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path

from workers.kvtiers.base import KVTier

SUFFIX = ".kvb"
_LEDGER = struct.Struct("<QQ")  # used bytes, generation
SCAN_SLACK = 32  # a scan's eviction frees capacity // SCAN_SLACK more than needed


class DiskTier(KVTier):
    name = "disk"

    def __init__(self, path: str | Path, capacity_bytes: int):
        super().__init__()
        self.path = Path(path)
        self.capacity_bytes = capacity_bytes
        self.stats.capacity_bytes = capacity_bytes
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # flock does not exclude threads sharing one descriptor
        self._fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        self._index: OrderedDict[str, tuple[int, int]] = OrderedDict()  # key -> (mtime_ns, size), oldest first
        self._synced_gen = -1  # the ledger generation at which the index was exact
        with self._exclusive():
            gen = (self._read_ledger() or (0, 0))[1]
            used = self._scan()
            if used > capacity_bytes:
                used = self._make_room(used, capacity_bytes)
            self._write_ledger(used, gen + 1, synced=True)

    # -- the ledger and the index, under the lock -----------------------------------------------
    @contextmanager
    def _exclusive(self):
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _read_ledger(self) -> tuple[int, int] | None:
        raw = os.pread(self._fd, _LEDGER.size, 0)
        return _LEDGER.unpack(raw) if len(raw) == _LEDGER.size else None

    def _write_ledger(self, used: int, gen: int, synced: bool) -> None:
        os.pwrite(self._fd, _LEDGER.pack(used, gen), 0)
        if synced:
            self._synced_gen = gen
        self.stats.used_bytes = used

    def _scan(self) -> int:
        """Rebuild the index from the directory; returns the bytes its blocks use."""
        found = []
        with os.scandir(self.path) as entries:
            for entry in entries:
                try:
                    if entry.name.endswith(SUFFIX) and not entry.name.startswith("."):
                        st = entry.stat()
                        found.append((st.st_mtime_ns, entry.name[: -len(SUFFIX)], st.st_size))
                    elif entry.name.endswith(".tmp"):  # writers hold the lock: this one's writer died
                        os.unlink(entry.path)
                except FileNotFoundError:
                    continue
        found.sort()
        self._index = OrderedDict((key, (mtime, size)) for mtime, key, size in found)
        return sum(size for _, _, size in found)

    def _make_room(self, used: int, target: int) -> int:
        """Evict least recently used files until `used` <= `target`; returns the new `used`."""
        evicted = 0
        while used > target and self._index:
            key, (mtime, _) = next(iter(self._index.items()))
            try:
                st = os.stat(self._file(key))
            except FileNotFoundError:  # removed behind the ledger's back; a scan will recount
                del self._index[key]
                continue
            if st.st_mtime_ns > mtime:  # another process read it since: recently used after all
                self._index[key] = (st.st_mtime_ns, st.st_size)
                self._index.move_to_end(key)
                continue
            os.unlink(self._file(key))
            del self._index[key]
            used -= st.st_size
            evicted += 1
        if evicted:
            self._count(evictions=evicted)
        return used

    def _file(self, key: str) -> Path:
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"not a block key: {key!r}")
        return self.path / (key + SUFFIX)

    def _touch(self, key: str, size: int) -> None:
        now = time.time_ns()
        try:
            os.utime(self._file(key), ns=(now, now))
        except FileNotFoundError:
            return
        with self._lock:
            if key in self._index:
                self._index[key] = (now, size)
                self._index.move_to_end(key)

    # -- the tier -------------------------------------------------------------------------------
    def _put_many(self, items: list[tuple[str, int, bytes]]) -> int:
        payloads = {key: payload for key, _, payload in items if len(payload) <= self.capacity_bytes}
        with self._exclusive():
            ledger = self._read_ledger()
            if ledger is None:  # unreadable: count the files again
                ledger = (self._scan(), 0)
                self._synced_gen = 0
            used, gen = ledger
            fresh = {}
            for key, payload in payloads.items():
                path = self._file(key)
                if path.exists():  # same key, same content: only its recency changes
                    now = time.time_ns()
                    os.utime(path, ns=(now, now))
                    if key in self._index:
                        self._index[key] = (now, len(payload))
                        self._index.move_to_end(key)
                else:
                    fresh[key] = payload
            need = sum(len(p) for p in fresh.values())
            synced = gen == self._synced_gen
            cap = self.capacity_bytes
            if used + need > cap:
                target = cap - need
                if not synced:  # others wrote since: see their files, and make room for a while
                    used, synced, target = self._scan(), True, target - cap // SCAN_SLACK
                used = self._make_room(used, target)
                if used + need > cap:  # the ledger counted files that are gone: count again
                    used, synced = self._make_room(self._scan(), cap - need), True
                while fresh and used + need > cap:  # what still does not fit is dropped
                    need -= len(fresh.pop(next(reversed(fresh))))
            self._write_ledger(used + need, gen + 1, synced)  # reserve before writing
            written = 0
            try:
                for key, payload in fresh.items():
                    written += self._write(key, payload)
            finally:
                if written != need:
                    self._write_ledger(used + written, gen + 1, synced)
        return written

    def _write(self, key: str, payload: bytes) -> int:
        final = self._file(key)
        tmp = self.path / f".{key}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(payload)
            mtime = os.stat(tmp).st_mtime_ns
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._index[key] = (mtime, len(payload))
        self._index.move_to_end(key)
        return len(payload)

    def _get_many(self, keys: list[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for key in keys:
            try:
                payload = self._file(key).read_bytes()
            except FileNotFoundError:
                out.append(None)
                continue
            self._touch(key, len(payload))
            out.append(payload)
        return out

    def _exists_many(self, keys: list[str]) -> list[bool]:
        return [self._file(key).exists() for key in keys]

    def _evict(self, keys: list[str]) -> None:
        with self._exclusive():
            used, gen = self._read_ledger() or (self._scan(), 0)
            synced = gen == self._synced_gen
            for key in keys:
                path = self._file(key)
                try:
                    size = path.stat().st_size
                    path.unlink()
                except FileNotFoundError:
                    continue
                self._index.pop(key, None)
                used -= size
            self._write_ledger(max(used, 0), gen + 1, synced)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
