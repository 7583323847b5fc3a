"""Helpers for the benchmarks and tests that start real Switchyard processes."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from workers.kvtiers.master import free_port

ROOT = Path(__file__).resolve().parents[2]


def stop(procs: list[subprocess.Popen], logs=(), timeout: float = 15.0) -> None:
    """SIGTERM every process (they drain), wait, SIGKILL what is left; close their log files."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for f in logs:
        f.close()


def start_replica(spec, workdir: Path, env: dict | None = None, core: int | None = None):
    """Write `spec` (a ReplicaSpec) into `workdir` and start `python -m workers.replica` on it,
    logging to workdir/replica-<id>.log, pinned to `core` if given. Returns (process, log file)."""
    path = workdir / f"replica-{spec.replica_id}.json"
    path.write_text(spec.to_json())
    log = open(workdir / f"replica-{spec.replica_id}.log", "wb")  # noqa: SIM115 - closed by stop()
    process = subprocess.Popen(
        [sys.executable, "-m", "workers.replica", "--replica-id", str(spec.replica_id), "--spec", str(path)],
        cwd=ROOT,
        env=env if env is not None else {**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=None if core is None else (lambda: os.sched_setaffinity(0, {core})),
    )
    return process, log


@contextmanager
def environ(**values: str) -> Iterator[None]:
    """os.environ with `values` set, restored on exit: for processes started inside that read
    their settings from the environment they inherit (a node agent's REPLICA_* variables)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile, q in (0, 1]: the smallest value with at least q of them at or
    below it (NaN for no values)."""
    if not 0 < q <= 1:  # 90 for the 90th percentile read as the maximum, unnoticed
        raise ValueError(f"percentile takes q in (0, 1], got {q}")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else float("nan")


class RedisServer:
    """A redis-server of its own, on `port` or a free one, so that it can be stopped (the
    machine's Redis never is). Nothing is persisted: started again, it is empty."""

    def __init__(self, port: int | None = None, cwd: Path | None = None):
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.cwd = cwd
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 10) -> None:
        """Start it and wait until it answers."""
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--maxclients", "20000"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.cwd,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        with redis.Redis(port=self.port) as client:
            while time.monotonic() < deadline:
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not answer within {timeout:g} s")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
