"""Freezing a process for real (SIGSTOP), as a hung host would be.

`kill(pid, SIGSTOP)` returns once the signal is queued, not once the process has stopped: the
kernel wakes one thread to stop the others, and until it has run, a thread that is already
running (or that a request just woke) keeps serving. Measured here: right after the call, a
Mooncake master had not stopped in 89 of 200 tries. A test that sends a request "to a stopped
process" must wait for every thread to be stopped first."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def is_stopped(pid: int) -> bool:
    """Whether every thread of `pid` is stopped (state T in /proc/<pid>/task/*/stat); a thread
    that is exiting counts as stopped. Raises ProcessLookupError once the process has exited."""
    states = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        raise ProcessLookupError(f"process {pid} has exited") from None
    for task in tasks:
        try:
            stat = task.joinpath("stat").read_text()
        except OSError:  # the thread exited meanwhile
            continue
        states[int(task.name)] = stat.rpartition(")")[2].split()[0]  # the name in () may hold spaces
    if states.get(pid, "Z") in "ZX":
        raise ProcessLookupError(f"process {pid} has exited")
    return all(state in "tTZX" for state in states.values())


def freeze(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP `pid` and return once all its threads are stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while not is_stopped(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not stop within {timeout:g}s of SIGSTOP")
        time.sleep(0.005)
