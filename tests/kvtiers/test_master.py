"""Running mooncake_master: start_master refuses a taken port and stop_master ends it; the module
runs it in the foreground for docker compose and operators."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.stack import wait_for
from workers.kvtiers.master import MasterError, free_port, start_master, stop_master

ROOT = Path(__file__).resolve().parents[2]


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


def test_start_and_stop(tmp_path):
    port = free_port()
    proc = start_master(port, free_port(), log_path=tmp_path / "master.log")
    try:
        assert listening(port)
        with pytest.raises(MasterError, match="already listens"):
            start_master(port, free_port())
    finally:
        stop_master(proc)
    assert proc.returncode is not None and not listening(port)


def test_the_module_runs_the_master_in_the_foreground():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.kvtiers.master", "--port", str(port), "--metrics-port", str(free_port())],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: listening(port), 15, "the master to listen")
        assert "mooncake_master" in Path(f"/proc/{proc.pid}/cmdline").read_text()  # exec'd: its own pid
    finally:
        stop_master(proc)
