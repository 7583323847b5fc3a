"""What every tier is: batched put/get/exists/evict of packed blocks, with the checks and counters
written once here (template methods) so no tier can forget them.

A tier is a cache: it may lose anything at any time, and its callers never wait on it for long
or see it fail. `put_many` never raises; `get_many` returns only payloads that passed
`unpack_block` (a payload that fails is counted, removed from the tier and reported as a miss).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

from workers.kvtiers.block import CorruptBlock, unpack_block

log = logging.getLogger(__name__)


@dataclass
class TierStats:
    """Counters since the tier started; all monotonic except used/capacity/available."""

    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    read_seconds: float = 0.0
    write_seconds: float = 0.0
    checksum_failures: int = 0
    errors: int = 0
    evictions: int = 0  # blocks the tier dropped to make room (not those a caller evicted)
    used_bytes: int = 0
    capacity_bytes: int = 0
    available: bool = True

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class TierError(Exception):
    """A backend refused or failed an operation in a way it is known to (no traceback logged)."""


class TierUnavailable(TierError):
    """The backend cannot serve now; the call counts as an error and returns empty-handed."""


class KVTier(ABC):
    name: str = ""

    def __init__(self) -> None:
        self.stats = TierStats()
        self._stats_lock = threading.Lock()
        self._failing = False  # inside a run of failed calls: warned once already

    # -- what a tier implements; each may raise, the public methods below catch ---------------
    @abstractmethod
    def _put_many(self, items: list[tuple[str, int, bytes]]) -> int:
        """Store the payloads; return how many bytes were actually written."""

    @abstractmethod
    def _get_many(self, keys: list[str]) -> list[bytes | memoryview | None]:
        """The stored payloads, unverified, None where absent."""

    @abstractmethod
    def _exists_many(self, keys: list[str]) -> list[bool]: ...

    @abstractmethod
    def _evict(self, keys: list[str]) -> None: ...

    def close(self) -> None:  # noqa: B027 (a tier with nothing to release keeps this)
        """Release what the tier holds open; the tier is not used afterwards."""

    # -- the public interface -------------------------------------------------------------------
    def _count(self, **deltas) -> None:
        """Add to counters, atomically with respect to other threads."""
        with self._stats_lock:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)

    def put_many(self, items: list[tuple[str, int, bytes]]) -> bool:
        """Store (key, block hash, payload from pack_block) items; never raises. False when the
        backend failed (the items may be partly stored)."""
        if not items:
            return True
        started = time.perf_counter()
        try:
            written = self._put_many(items)
        except Exception as exc:
            self._failed("put", exc)
            return False
        self._succeeded()
        self._count(bytes_written=written, write_seconds=time.perf_counter() - started)
        return True

    def get_many(self, keys: list[str], hashes: list[int]) -> list[bytes | None]:
        """Verified payloads in the order of `keys`, None for a miss; a backend failure is a
        miss of every key, never an exception."""
        if len(keys) != len(hashes):
            raise ValueError(f"{len(keys)} keys but {len(hashes)} hashes")
        if not keys:
            return []
        started = time.perf_counter()
        try:
            raw = self._get_many(keys)
        except Exception as exc:
            self._failed("get", exc)
            self._count(misses=len(keys), read_seconds=time.perf_counter() - started)
            return [None] * len(keys)
        self._succeeded()
        out: list[bytes | None] = []
        corrupt: list[str] = []
        nbytes = 0
        for key, block_hash, payload in zip(keys, hashes, raw, strict=True):
            if payload is None:
                out.append(None)
                continue
            nbytes += len(payload)
            try:
                unpack_block(payload, block_hash)
            except CorruptBlock as exc:
                log.warning("%s tier: block %s is corrupt (%s); dropped", self.name, key, exc)
                corrupt.append(key)
                out.append(None)
                continue
            out.append(payload if isinstance(payload, bytes) else bytes(payload))
        hits = sum(p is not None for p in out)
        self._count(
            hits=hits,
            misses=len(keys) - hits,
            bytes_read=nbytes,
            checksum_failures=len(corrupt),
            read_seconds=time.perf_counter() - started,
        )
        if corrupt:
            self.evict(corrupt)
        return out

    def exists_many(self, keys: list[str]) -> list[bool]:
        """Whether each key is held (a hint: a later get may still miss); never raises."""
        if not keys:
            return []
        try:
            found = self._exists_many(keys)
        except Exception as exc:
            self._failed("exists", exc)
            return [False] * len(keys)
        self._succeeded()
        return found

    def evict(self, keys: list[str]) -> None:
        """Drop these keys if held; never raises."""
        if not keys:
            return
        try:
            self._evict(keys)
        except Exception as exc:
            self._failed("evict", exc)

    # -- failures: counted each time, logged once per run of them -------------------------------
    def _failed(self, op: str, exc: Exception) -> None:
        self._count(errors=1)
        if isinstance(exc, TierUnavailable):
            return  # the tier logs its own outages
        if not self._failing:
            self._failing = True
            log.warning(
                "%s tier: %s failed (%s); further failures are counted, not logged",
                self.name,
                op,
                exc,
                exc_info=not isinstance(exc, OSError | TierError),
            )
        else:
            log.debug("%s tier: %s failed: %s", self.name, op, exc)

    def _succeeded(self) -> None:
        self._failing = False
