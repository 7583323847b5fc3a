"""Helpers for the benchmarks and tests that start real Switchyard processes."""

from __future__ import annotations

import socket
import subprocess


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
