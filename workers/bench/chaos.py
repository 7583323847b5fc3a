"""Chaos benchmark: does anything get lost when a process dies?

It runs the product as an operator would (`python -m scripts.run`, i.e. `make run`, on a
temporary state directory, with its own redis-server on a free port so that Redis itself can be
stopped), scales the demo deployment to two replicas and keeps a steady load on it (`--clients`
streaming chat completions, each client looping). Then, in turn, with the load running:

- replica_kill: SIGKILL one replica; recovered when two replicas are ready again.
- replica_hang: SIGSTOP one replica (its agent kills it after REPLICA_HANG_SECONDS); the same.
- agent_kill: SIGKILL the node agent (make run restarts it, it adopts the replicas); recovered
  when a new agent's reports arrive and two replicas are ready.
- control_kill: SIGKILL the control worker (make run restarts it); recovered when a new one
  applies the agent's reports again.
- redis_outage: SIGKILL redis-server, start it again (empty) after 10 s; recovered when a
  request started after Redis returned is served.
Every fault also waits for a request started after it to be served.

Per fault: requests that overlapped the fault window (failed / total), how many moved to the
other replica mid-stream (resumed), and the recovery time (from the fault, or for Redis from its
return). A failed request is one that ended with an error event or status; a cut stream (no
[DONE]) is counted separately, and should never happen. Last: `--streams` concurrent streams at
once, held (every token and [DONE]) or lost.

The last line is one JSON object:
{"faults": {name: {"failed", "total", "recovery_s", "resumed"}}, "streams_held", "streams_lost"}.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from workers.bench.processes import ROOT, RedisServer, free_port

QUESTION = [{"role": "user", "content": "What is the capital of Japan?"}]
RECOVERY_TIMEOUT = 180.0


def log(message: str, quiet: bool) -> None:
    if not quiet:
        print(message, flush=True)


@dataclass
class Record:
    start: float
    end: float = 0.0
    ok: bool = False
    error: str | None = None
    cut: bool = False  # ended without [DONE] or an error: the client saw a broken stream
    resumed: bool = False
    tokens: int = 0


async def stream_once(http: httpx.AsyncClient, url: str, key: str, max_tokens: int) -> Record:
    """One streamed chat completion, greedy, exactly `max_tokens` tokens."""
    rec = Record(start=time.monotonic())
    body = {"model": "demo", "messages": QUESTION, "temperature": 0, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
    done = False
    try:
        async with http.stream("POST", url, json=body, headers={"Authorization": f"Bearer {key}"}) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                rec.error = f"{response.status_code}: {text[:200]}"
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        done = True
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        rec.error = f"{chunk['error'].get('code')}: {chunk['error'].get('message', '')[:200]}"
                        continue
                    if (chunk.get("x_switchyard") or {}).get("resumed"):
                        rec.resumed = True
                    if chunk.get("usage"):
                        rec.tokens = chunk["usage"]["completion_tokens"]
                if not done:
                    rec.cut = True
                    rec.error = rec.error or "stream cut without [DONE]"
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        rec.cut, rec.error = True, f"{type(exc).__name__}: {exc}"
    rec.end = time.monotonic()
    rec.ok = done and rec.error is None and rec.tokens == max_tokens
    if not rec.ok and rec.error is None:
        rec.error = f"{rec.tokens} of {max_tokens} tokens"
    return rec


class Stack:
    """`python -m scripts.run` on a temporary state directory, and the management API."""

    def __init__(self, quiet: bool, hang_seconds: float):
        self.quiet = quiet
        self.dir = Path(tempfile.mkdtemp(prefix="sy-chaos-"))
        self.redis = RedisServer(cwd=self.dir)
        self.redis.start()
        self.port = free_port()
        self.node = f"chaos-{uuid.uuid4().hex[:6]}"
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")},
            "SWITCHYARD_STATE_DIR": str(self.dir / "state"),
            "REDIS_URL": self.redis.url,
            "PORT": str(self.port),
            "SWITCHYARD_NODE": self.node,
            "CHANNELS_PREFIX": f"chaos-{self.node}",
            "REPLICA_HANG_SECONDS": str(hang_seconds),
            "REPLICA_CPU_THREADS": "1",
            "RECONCILE_INTERVAL": "2",
            "PYTHONPATH": str(ROOT),
        }
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_file = open(self.dir / "run.log", "wb")  # noqa: SIM115 - closed by close()
        self.run = subprocess.Popen(
            [sys.executable, "-m", "scripts.run"],
            cwd=ROOT,
            env=self.env,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
        )
        self._wait_running()
        info = json.loads((self.dir / "state" / "run.json").read_text())
        self.key = info["api_key"]
        out = subprocess.run([sys.executable, "manage.py", "create_token", info["admin_user"]], cwd=ROOT,
                             env=self.env, capture_output=True, text=True, check=True)  # fmt: skip
        self.token = out.stdout.strip().splitlines()[-1]

    def _wait_running(self, timeout: float = 400) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = (self.dir / "run.log").read_text(errors="replace")
            if "Switchyard is running." in text:
                return
            if self.run.poll() is not None or "FAILED" in text:
                raise SystemExit(f"make run did not come up; see {self.dir / 'run.log'}")
            time.sleep(0.5)
        raise SystemExit(f"make run was not running after {timeout:g} s; see {self.dir / 'run.log'}")

    async def api(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.request(
                method, f"{self.base}/api/v1/{path}", json=body, headers={"Authorization": f"Bearer {self.token}"}
            )
            return r.status_code, (r.json() if r.content else {})

    async def ready_replicas(self) -> list[dict]:
        try:
            status, body = await self.api("GET", "replicas/?deployment__slug=demo&state=ready")
        except httpx.HTTPError:
            return []
        return body.get("results", []) if status == 200 else []

    async def node_heartbeat(self) -> str | None:
        try:
            status, body = await self.api("GET", f"nodes/?name={self.node}")
        except httpx.HTTPError:
            return None
        rows = body.get("results", []) if status == 200 else []
        return rows[0]["last_heartbeat"] if rows else None

    def process(self, kind: str) -> psutil.Process | None:
        """make run's child process `kind` (agent, control)."""
        marker = {"agent": "workers.agent", "control": "control@"}[kind]
        for child in psutil.Process(self.run.pid).children(recursive=True):
            try:
                if any(marker in part for part in child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                continue
        return None

    def close(self, keep: bool) -> None:
        if self.run.poll() is None:
            self.run.send_signal(signal.SIGINT)
            try:
                self.run.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.run.kill()
                self.run.wait()
        self.log_file.close()
        self.redis.kill()
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


class Load:
    """`clients` loops of streamed requests; every request kept as a Record."""

    def __init__(self, stack: Stack, clients: int, max_tokens: int):
        self.stack, self.clients, self.max_tokens = stack, clients, max_tokens
        self.records: list[Record] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    async def _client(self) -> None:
        url = f"{self.stack.base}/v1/chat/completions"
        async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=10)) as http:
            while not self._stop.is_set():
                rec = await stream_once(http, url, self.stack.key, self.max_tokens)
                self.records.append(rec)
                if not rec.ok:
                    await asyncio.sleep(0.5)  # as a client would, before retrying

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._client()) for _ in range(self.clients)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    def served_since(self, t: float) -> bool:
        return any(r.ok and r.start >= t for r in self.records)

    def window(self, t0: float, t1: float) -> list[Record]:
        return [r for r in self.records if r.start < t1 and r.end > t0]


async def wait_until(check, timeout: float = RECOVERY_TIMEOUT) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return time.monotonic()
        await asyncio.sleep(0.25)
    return None


async def run_fault(name: str, stack: Stack, load: Load, quiet: bool) -> dict:
    replicas = await stack.ready_replicas()
    t0 = time.monotonic()
    ref = t0
    if name in ("replica_kill", "replica_hang"):
        victim = replicas[0]["pid"]
        os.kill(victim, signal.SIGKILL if name == "replica_kill" else signal.SIGSTOP)

        async def recovered():
            pids = [r["pid"] for r in await stack.ready_replicas()]
            return len(pids) == 2 and victim not in pids and load.served_since(t0)

    elif name in ("agent_kill", "control_kill"):
        kind = name.split("_")[0]
        victim_proc = stack.process(kind)
        if victim_proc is None:
            raise SystemExit(f"no {kind} process found under make run")
        before = await stack.node_heartbeat()
        victim_proc.kill()
        victim = victim_proc.pid

        async def recovered():
            now = stack.process(kind)
            beat = await stack.node_heartbeat()
            return (
                now is not None
                and now.pid != victim
                and beat is not None
                and beat != before
                and len(await stack.ready_replicas()) == 2
                and load.served_since(t0)
            )

    else:  # redis_outage
        stack.redis.kill()
        await asyncio.sleep(10)
        stack.redis.start()
        ref = time.monotonic()

        async def recovered():
            return load.served_since(ref)

    t1 = await wait_until(recovered)
    if t1 is None:
        log(f"{name}: NOT recovered within {RECOVERY_TIMEOUT:g} s", quiet)
        t1 = time.monotonic()
        recovery = None
    else:
        # For Redis: when the first request started after its return was served.
        if name == "redis_outage":
            t1 = min(r.end for r in load.records if r.ok and r.start >= ref)
        recovery = round(t1 - ref, 2)
    await asyncio.sleep(2)  # let requests started before recovery finish, so the window is complete
    window = load.window(t0, t1)
    failed = [r for r in window if not r.ok]
    result = {
        "failed": len(failed),
        "total": len(window),
        "recovery_s": recovery,
        "resumed": sum(r.resumed for r in window),
    }
    cut = sum(r.cut for r in window)
    errors = sorted({(r.error or "")[:80] for r in failed})
    log(
        f"{name:13s} failed {result['failed']:3d}/{result['total']:<4d} resumed {result['resumed']:3d}  "
        f"recovery {recovery if recovery is not None else 'never'} s  cut streams {cut}"
        + (f"  errors: {errors[:3]}" if errors else ""),
        quiet,
    )
    if name == "redis_outage":
        down, back = t0, ref
        in_flight = [r for r in window if r.start < down]
        during = [r for r in window if down <= r.start < back]
        after = [r for r in window if r.start >= back]
        log(
            f"{'':13s} in flight when Redis went: {sum(not r.ok for r in in_flight)}/{len(in_flight)} failed; "
            f"started while it was away: {sum(not r.ok for r in during)}/{len(during)} refused; "
            f"started after it returned: {sum(not r.ok for r in after)}/{len(after)} failed",
            quiet,
        )
    await asyncio.sleep(3)  # settle before the next fault
    return result


async def hold_streams(stack: Stack, n: int, max_tokens: int) -> tuple[int, int, list[str]]:
    limits = httpx.Limits(max_connections=n + 16, max_keepalive_connections=n + 16)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=60), limits=limits) as http:
        url = f"{stack.base}/v1/chat/completions"
        records = await asyncio.gather(*(stream_once(http, url, stack.key, max_tokens) for _ in range(n)))
    held = sum(r.ok for r in records)
    errors = sorted({(r.error or "")[:120] for r in records if not r.ok})
    return held, n - held, errors


def _raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))


async def _main(args) -> dict:
    quiet = args.json
    faults = [f for f in args.faults.split(",") if f]
    _raise_fd_limit(4 * args.streams + 1024)  # inherited by make run's web server
    log(f"starting make run on its own Redis (clients {args.clients}, streams {args.streams})", quiet)
    stack = Stack(quiet, args.hang_seconds)
    try:
        status, body = await stack.api("PATCH", "deployments/demo/", {"replicas": 2})
        if status != 200:
            raise SystemExit(f"could not scale the demo deployment: {status} {body}")
        if await wait_until(lambda: _two_ready(stack), 180) is None:
            raise SystemExit(f"the demo deployment did not reach 2 ready replicas; see {stack.dir}")
        load = Load(stack, args.clients, args.tokens)
        load.start()
        await asyncio.sleep(5)  # steady state
        results = {}
        for name in faults:
            results[name] = await run_fault(name, stack, load, quiet)
        await load.stop()
        steady = [r for r in load.records if r.ok]
        log(
            f"load: {len(load.records)} requests, {len(steady)} served, {sum(r.cut for r in load.records)} cut streams",
            quiet,
        )
        held, lost = (0, 0)
        if args.streams:
            held, lost, errors = await hold_streams(stack, args.streams, args.stream_tokens)
            log(
                f"{args.streams} concurrent streams: {held} held, {lost} lost" + (f": {errors[:3]}" if errors else ""),
                quiet,
            )
        return {"faults": results, "streams_held": held, "streams_lost": lost}
    finally:
        stack.close(keep=args.keep)


async def _two_ready(stack: Stack) -> bool:
    return len(await stack.ready_replicas()) == 2


def run(args) -> int:
    summary = asyncio.run(_main(args))
    print(json.dumps(summary))
    return 0
