"""Mooncake Store tier: a KV-block pool shared by every replica of a deployment, across nodes.

Each replica's client contributes `segment_bytes` of its memory to the pool; `mooncake_master`
(workers/kvtiers/master.py) keeps the index and evicts by approximate LRU when the pool fills.
A block can live in any client's segment, so it disappears when that client leaves: another
replica's get then misses, which the checksum rules treat like any miss. Metadata uses
"P2PHANDSHAKE" (no etcd or metadata server: peers exchange addresses directly).

Mooncake's calls can block for seconds (a put with the master gone took about 4 s here, every
call to a hung master 30 s). So the tier never makes its caller wait on one longer than
`timeout_s`: every Mooncake call runs on one thread of the tier's own, and a caller waits for its
result with that bound. The data calls release the GIL while they wait; `setup` and `close` do
not (0.3.13.post1): they stop every thread of the process for as long as they take (setup: 40 ms
with a master, 4.4 s without, 30 s with a hung one; close: 2 s, 12 s with the master gone, and
the client's destructor the same at exit). So setup is only tried once the master's port accepts
a connection (and, with `metrics_address`, once its metrics answer, which a hung master's do not). A call that
fails with an RPC error or outlasts the bound marks the tier unavailable: one warning is logged,
gets miss and puts are dropped at once (counted as errors), and a background thread retries
every `reconnect_s` until the master answers, then logs once that it is back. The client keeps
its own connection to the master and re-registers its segment when the master returns, so
retrying means probing, not building a new client. Blocks put before the master went away are
gone with its index.

A master restarted between two calls goes unnoticed by the calls themselves: the client reconnects
to the new master on the same address by itself, and the pool is empty. So once connected, the
tier puts a small marker object of its own and checks every `reconnect_s` that it still exists.
`epoch` goes up at every (re)connection and whenever the marker is gone (a restarted master, or
an eviction under pressure): what this client put before may be gone then (tiered_cache.py
forgets which blocks it put).

Puts skip keys the store holds (objects are immutable; re-sending the bytes would be wasted), and
a get tells a miss from a dead master by asking which of the empty answers exist (a missing key
and an unreachable master both read as b'').
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import socket
import threading
import urllib.request
import uuid

from workers.kvtiers.base import KVTier, TierError, TierUnavailable

log = logging.getLogger(__name__)

_RPC_ERRORS = range(-999, -899)  # Mooncake's RPC error codes: the master is unreachable or hung
_PROBE_KEY = "switchyard-kvtiers-probe"


def read_pool_metrics(metrics_address: str, timeout_s: float) -> dict[str, int]:
    """The pool's `master_allocated_bytes` and `master_total_capacity_bytes` from the master's
    metrics at host:port (those it reports); OSError when they do not answer."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=timeout_s) as resp:
        text = resp.read().decode()
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("master_allocated_bytes", "master_total_capacity_bytes"):
            values[name] = int(float(value))
    return values


class _CallThread:
    """One daemon thread that runs the submitted calls in order. A daemon, so a call stuck in
    Mooncake never holds up the interpreter's exit."""

    def __init__(self, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, *args) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((future, fn, args))
        return future

    def stop(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue  # its caller gave up before it started
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)


class MooncakeStoreTier(KVTier):
    name = "store"

    def __init__(
        self,
        master_address: str,
        local_hostname: str = "127.0.0.1",
        segment_bytes: int = 256 << 20,
        buffer_bytes: int = 64 << 20,
        protocol: str = "tcp",
        device_name: str = "",
        timeout_s: float = 2.0,
        reconnect_s: float = 2.0,
        metrics_address: str = "",
    ):
        """`metrics_address` ("host:port" of the master's --metrics_port), when given, makes
        used/capacity report the whole pool as the master counts it; without it capacity is
        the segment this client contributes and used stays 0 (the client API has no call
        that reports use)."""
        super().__init__()
        self.master_address = master_address
        self.local_hostname = local_hostname
        self.segment_bytes = segment_bytes
        self.buffer_bytes = buffer_bytes
        self.protocol = protocol
        self.device_name = device_name
        self.timeout_s = timeout_s
        self.reconnect_s = reconnect_s
        self.metrics_address = metrics_address
        self.stats.available = False
        self.stats.capacity_bytes = segment_bytes
        # Without this, a setup with the master down retries for ~90 s; the tier retries itself.
        # Set here, before this tier's threads start (setenv races with readers in C threads).
        os.environ.setdefault("MC_STORE_CLIENT_SETUP_RETRIES", "1")
        self._store = None  # touched only on the call thread
        self._set_up = False
        self._calls = _CallThread("kv-store-calls")
        self._attempt: concurrent.futures.Future | None = None
        self._state_lock = threading.Lock()
        self._warned = False  # an outage was logged and its end is not yet
        self._connected_once = False
        self.epoch = 0  # see the module docstring
        self._marker = f"switchyard-kvtiers-marker-{uuid.uuid4().hex}"
        self._marker_held = False  # the marker was put since the last (re)connection
        self._closed = threading.Event()
        self._wake = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name="kv-store-reconnect", daemon=True)
        self._supervisor.start()

    # -- availability ---------------------------------------------------------------------------
    def _lost(self, reason: str) -> None:
        with self._state_lock:
            self.stats.available = False
            if self._warned or self._closed.is_set():
                return
            self._warned = True
        log.warning(
            "Mooncake store at %s unavailable (%s); serving without it, retrying every %gs",
            self.master_address,
            reason,
            self.reconnect_s,
        )
        self._wake.set()

    def _found(self) -> None:
        with self._state_lock:
            if self._closed.is_set():
                return
            self.epoch += 1  # before `available`: no caller sees the new connection with the old epoch
            self._marker_held = False
            self.stats.available = True
            back, self._warned = self._warned and self._connected_once, False
            self._connected_once = True
        log.info("Mooncake store at %s %s", self.master_address, "reconnected" if back else "connected")

    def _supervise(self) -> None:
        while not self._closed.is_set():
            if not self.stats.available:
                reason = self._try_connect()
                if self._closed.is_set():
                    return
                if reason is None:
                    self._found()
                    self._check_marker()
                else:
                    self._lost(reason)
            else:
                self._check_marker()
                if self.metrics_address:
                    self._read_pool_usage()
            self._wake.wait(self.reconnect_s)
            self._wake.clear()

    def _try_connect(self) -> str | None:
        """None once the master answers, else why not. At most one attempt is in flight: one
        stuck behind a hung call is waited for again, not queued again."""
        if self._attempt is None:
            if not self._set_up:
                unreachable = self._master_unreachable()
                if unreachable:
                    return unreachable
            self._attempt = self._calls.submit(self._connect)
        try:
            self._attempt.result(timeout=self.timeout_s)
        except TimeoutError:
            return "no answer in time"
        except Exception as exc:
            self._attempt = None
            return str(exc)
        self._attempt = None
        return None

    def _master_unreachable(self) -> str | None:
        """Why setup would block now, or None. Checked on the supervisor thread, which these
        waits do not stop, because setup itself holds the GIL while it retries."""
        host, _, port = self.master_address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=self.timeout_s).close()
        except (OSError, ValueError) as exc:
            return f"master not reachable: {exc}"
        if self.metrics_address:
            try:
                urllib.request.urlopen(f"http://{self.metrics_address}/metrics", timeout=self.timeout_s).close()
            except OSError as exc:
                return f"master not answering: {exc}"
        return None

    def _connect(self) -> None:
        """On the call thread: set the client up once, afterwards probe the master."""
        if not self._set_up:
            try:
                from mooncake.store import MooncakeDistributedStore
            except ImportError as exc:
                raise TierError(
                    f"Mooncake is not importable ({exc}); install mooncake-transfer-engine-non-cuda "
                    "(or mooncake-transfer-engine on CUDA machines)"
                ) from exc
            self._store = self._store or MooncakeDistributedStore()
            rc = self._store.setup(
                self.local_hostname,
                "P2PHANDSHAKE",
                self.segment_bytes,
                self.buffer_bytes,
                self.protocol,
                self.device_name,
                self.master_address,
            )
            if rc != 0:
                raise TierError(f"setup returned {rc}")
            self._set_up = True
            return
        self._exists([_PROBE_KEY])

    def _check_marker(self) -> None:
        """On the supervisor thread, while connected: put the marker, or see that it is still
        there; a marker gone since it was put starts a new epoch."""
        try:
            if self._marker_held and self._call(self._exists, [self._marker])[0]:
                return
            if self._marker_held:
                with self._state_lock:
                    self.epoch += 1
                    self._marker_held = False
                log.info("Mooncake store at %s lost this client's objects (restarted or evicted)", self.master_address)
            self._call(self._put, [self._marker], [b"\x01"])
            self._marker_held = True
        except TierError as exc:  # an outage was marked by _call; a full pool is tried again later
            log.debug("the store's marker: %s", exc)

    def _read_pool_usage(self) -> None:
        try:
            values = read_pool_metrics(self.metrics_address, self.timeout_s)
        except OSError as exc:
            log.debug("reading the store master's metrics failed: %s", exc)
            return
        self.stats.used_bytes = values.get("master_allocated_bytes", self.stats.used_bytes)
        self.stats.capacity_bytes = values.get("master_total_capacity_bytes", self.stats.capacity_bytes)

    # -- bounded calls --------------------------------------------------------------------------
    def _call(self, fn, *args):
        if not self.stats.available:
            raise TierUnavailable("store not connected")
        future = self._calls.submit(fn, *args)
        try:
            return future.result(timeout=self.timeout_s)
        except TimeoutError:
            future.cancel()
            self._lost(f"a call took longer than {self.timeout_s:g}s")
            raise TierUnavailable("store call timed out") from None
        except TierUnavailable as exc:
            self._lost(str(exc))
            raise

    # The functions below run on the call thread.
    def _exists(self, keys: list[str]) -> list[bool]:
        codes = self._store.batch_is_exist(keys)
        bad = [c for c in codes if c < 0]
        if bad:
            raise TierUnavailable(f"batch_is_exist returned {bad[0]}")
        return [c == 1 for c in codes]

    def _put(self, keys: list[str], values: list) -> int:
        held = self._exists(keys)
        todo = [(k, v) for k, v, h in zip(keys, values, held, strict=True) if not h]
        if not todo:
            return 0
        rc = self._store.put_batch([k for k, _ in todo], [v for _, v in todo])
        if rc in _RPC_ERRORS:
            raise TierUnavailable(f"put_batch returned {rc}")
        if rc != 0:  # e.g. -200: no room until the master's eviction catches up; some may be in
            raise TierError(f"put_batch of {len(todo)} blocks returned {rc}")
        return sum(len(v) for _, v in todo)

    def _get(self, keys: list[str]) -> list[bytes | None]:
        out = [v or None for v in self._store.get_batch(keys)]
        empty = [k for k, v in zip(keys, out, strict=True) if v is None]
        if empty:
            self._exists(empty)  # raises if the master, not the key, is missing
        return out

    def _remove(self, keys: list[str]) -> None:
        # force: a get just leased the object (5 s), which would block a plain remove
        codes = self._store.batch_remove(keys, True)
        bad = [c for c in codes if c in _RPC_ERRORS]
        if bad:
            raise TierUnavailable(f"batch_remove returned {bad[0]}")

    # -- the tier -------------------------------------------------------------------------------
    def _put_many(self, items: list[tuple[str, int, bytes]]) -> int:
        unique = {key: payload for key, _, payload in items}
        return self._call(self._put, list(unique), list(unique.values()))

    def _get_many(self, keys: list[str]) -> list[bytes | None]:
        return self._call(self._get, keys)

    def _exists_many(self, keys: list[str]) -> list[bool]:
        return self._call(self._exists, keys)

    def _evict(self, keys: list[str]) -> None:
        self._call(self._remove, keys)

    def close(self, timeout_s: float = 15.0) -> None:
        """Unmount this client's segment (see the module docstring for how long that stops the
        process); waits at most `timeout_s`, then leaves it to the call thread."""
        if self._marker_held and self.stats.available:  # leave nothing behind in the pool
            try:
                self._call(self._remove, [self._marker])
            except TierError as exc:
                log.debug("removing the store's marker: %s", exc)
        with self._state_lock:
            self._closed.set()
            self.stats.available = False
        self._wake.set()
        if self._set_up:
            try:
                self._calls.submit(self._store.close).result(timeout=timeout_s)
            except Exception as exc:
                log.debug("closing the Mooncake client: %s", exc)
        self._calls.stop()
