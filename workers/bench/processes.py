"""Helpers for the benchmarks and tests that start real Switchyard processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile (NaN for no values)."""
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else float("nan")
