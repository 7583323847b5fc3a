"""Running the Mooncake Store's own processes.

`mooncake_master` is the store's index: `make run` and the tests start one with `start_master`;
docker compose and operators run `python -m workers.kvtiers.master --port P` in the foreground.
It keeps no state across restarts: the pool starts empty each time.

`mooncake_client` (`start_segment_server`) only contributes memory to the pool. A block lives in
the segment of whichever client the master placed it in, and goes when that client goes: with
replicas as the only segments, a restarted replica takes its share of the pool with it (observed:
9 of 32 blocks left after their writer exited, with two 32 MiB segments). Replicas that
contribute nothing (segment_bytes=0) next to a segment server per node keep every block across
replica restarts (32 of 32).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path


class MasterError(Exception):
    pass


def master_binary() -> str:
    """`mooncake_master` beside this interpreter (a venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / "mooncake_master"
    if beside.exists():
        return str(beside)
    found = shutil.which("mooncake_master")
    if found is None:
        raise MasterError(
            "mooncake_master not found next to the Python interpreter or on PATH; it ships with "
            "the mooncake-transfer-engine-non-cuda (or mooncake-transfer-engine) package"
        )
    return found


def master_command(
    port: int, metrics_port: int, host: str = "127.0.0.1", extra_args: tuple[str, ...] = ()
) -> list[str]:
    return [
        master_binary(),
        f"--rpc_port={port}",
        f"--rpc_address={host}",
        f"--metrics_port={metrics_port}",
        *extra_args,
    ]


_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (another process may still take it before we do), and not
    one this process was handed before: two calls in a row may otherwise get the same port, as
    the first is not bound until its server starts."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def _listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.2).close()
    except OSError:
        return False
    return True


def start_master(
    port: int,
    metrics_port: int,
    host: str = "127.0.0.1",
    extra_args: tuple[str, ...] = (),
    log_path: str | Path | None = None,
    timeout_s: float = 10.0,
) -> subprocess.Popen:
    """Start `mooncake_master` and return once it accepts connections on `port`. Its output goes
    to `log_path` (appended) or, without one, to this process's stdout/stderr."""
    return _start(master_command(port, metrics_port, host, extra_args), host, port, log_path, timeout_s)


def start_segment_server(
    master_address: str,
    segment_bytes: int,
    port: int,
    host: str = "127.0.0.1",
    buffer_bytes: int = 16 << 20,
    protocol: str = "tcp",
    log_path: str | Path | None = None,
    timeout_s: float = 10.0,
) -> subprocess.Popen:
    """Start `mooncake_client` holding `segment_bytes` of the pool for the master at
    `master_address`; returns once it serves on `port`, which it opens after mounting its
    segment. Stop it with `stop_master`."""
    cmd = segment_server_command(master_address, segment_bytes, port, host, buffer_bytes, protocol)
    return _start(cmd, host, port, log_path, timeout_s)


def segment_server_command(
    master_address: str,
    segment_bytes: int,
    port: int,
    host: str = "127.0.0.1",
    buffer_bytes: int = 16 << 20,
    protocol: str = "tcp",
) -> list[str]:
    binary = Path(master_binary()).with_name("mooncake_client")
    return [
        str(binary if binary.exists() else shutil.which("mooncake_client") or binary),
        f"--master_server_address={master_address}",
        "--metadata_server=P2PHANDSHAKE",
        f"--global_segment_size={segment_bytes}",
        f"--local_buffer_size={buffer_bytes}",
        f"--host={host}",
        f"--port={port}",
        f"--protocol={protocol}",
    ]


def _start(cmd: list[str], host: str, port: int, log_path: str | Path | None, timeout_s: float) -> subprocess.Popen:
    """Run `cmd`, output to `log_path` (appended) or inherited, and wait until `port` listens."""
    name = Path(cmd[0]).name
    if _listening(host, port):
        raise MasterError(f"something already listens on {host}:{port}")
    log = open(log_path, "ab") if log_path else None  # noqa: SIM115 (the child keeps it open)
    try:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    finally:
        if log is not None:
            log.close()
    deadline = time.monotonic() + timeout_s
    while not _listening(host, port):
        if proc.poll() is not None:
            raise MasterError(f"{name} exited with code {proc.returncode} before listening on {port}")
        if time.monotonic() > deadline:
            stop_master(proc)
            raise MasterError(f"{name} did not listen on {host}:{port} within {timeout_s:g}s")
        time.sleep(0.02)
    return proc


def stop_master(proc: subprocess.Popen, timeout_s: float = 5.0) -> None:
    """Terminate the master (or a segment server), killing it if it outlasts `timeout_s`."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> None:
    """`python -m workers.kvtiers.master [--port P]`: the master in the foreground.
    `python -m workers.kvtiers.master pool --master HOST:PORT --bytes N [--port P]`: a segment
    server holding N bytes of the pool (one per node with spare memory)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["pool"]:
        parser = argparse.ArgumentParser(prog="python -m workers.kvtiers.master pool", description=main.__doc__)
        parser.add_argument("--master", required=True, help="the master's host:port")
        parser.add_argument("--bytes", type=int, required=True, help="memory this server lends the pool")
        parser.add_argument("--port", type=int, default=50052, help="its service port (default 50052)")
        parser.add_argument("--host", default="127.0.0.1", help="how the store's clients reach it")
        parser.add_argument("--protocol", default="tcp", help="tcp, or rdma where the NICs exist")
        args = parser.parse_args(argv[1:])
        cmd = segment_server_command(args.master, args.bytes, args.port, args.host, protocol=args.protocol)
    else:
        parser = argparse.ArgumentParser(prog="python -m workers.kvtiers.master", description=__doc__)
        parser.add_argument("--port", type=int, default=50051, help="RPC port (default 50051)")
        parser.add_argument("--metrics-port", type=int, default=9003, help="HTTP metrics port (default 9003)")
        parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 in a container)")
        args, extra = parser.parse_known_args(argv)
        cmd = master_command(args.port, args.metrics_port, args.host, tuple(extra))
    os.execv(cmd[0], cmd)  # the program itself in the foreground: signals and exit code are its own


if __name__ == "__main__":
    main()
