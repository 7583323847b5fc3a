"""Gateway benchmark: what the serving path adds to the engine, and how many streams it holds.

It starts a throwaway platform (SQLite in a temporary directory, its own Redis database): a
replica process with the demo model (or --model) and the web server (uvicorn). Then, in one run:

1. **Per-token latency**: the same greedy request (completions, `max_tokens` tokens, EOS
   ignored) through the full path (client → gateway → Redis → replica → gateway → client, SSE)
   and through the engine alone in this process (same model, same thread count). Reported:
   inter-token gaps p50/p90 of each and their difference (the added per-token latency), and the
   added time to first token.
2. **Concurrent streams**: N streaming requests at once (N = 100, 200, 400 by default); a stream
   counts as held when it delivers every token and `[DONE]`.

The last line is one JSON object.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workers.bench.processes import ROOT, free_port, percentile, start_replica, stop

BENCH_REDIS_DB = 12


def log(message: str, quiet: bool) -> None:
    if not quiet:
        print(message, flush=True)


class Platform:
    """uvicorn + one replica process on a temporary state directory; stopped on exit."""

    def __init__(self, model: str, max_num_seqs: int, threads: int):
        import redis

        from workers.protocol.replica import ReplicaSpec

        self.dir = Path(tempfile.mkdtemp(prefix="sy-bench-"))
        self.redis_url = f"redis://127.0.0.1:6379/{BENCH_REDIS_DB}"
        self.redis = redis.Redis.from_url(self.redis_url, decode_responses=True)
        self.redis.flushdb()
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        env.update(
            SWITCHYARD_STATE_DIR=str(self.dir),
            REDIS_URL=self.redis_url,
            DJANGO_SETTINGS_MODULE="controlplane.config.settings",
            PYTHONPATH=str(ROOT),
        )
        # The control plane's side of the platform is made by its own command (this package
        # never imports Django): a model, a deployment with one hand-made ready replica, a key.
        out = subprocess.run(
            [sys.executable, "manage.py", "bench_platform", model, str(max_num_seqs)],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        info = json.loads(out.stdout.strip().splitlines()[-1])
        self.replica_id, self.api_key = info["replica_id"], info["api_key"]
        spec = ReplicaSpec(replica_id=self.replica_id, deployment="bench", model_dir=model, model_name="bench",
                           max_num_seqs=max_num_seqs, threads=threads, redis_url=self.redis_url)  # fmt: skip
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        replica, replica_log = start_replica(spec, self.dir, env)
        web_log = open(self.dir / "web.log", "wb")  # noqa: SIM115 - closed by stop()
        web = subprocess.Popen([sys.executable, "-m", "uvicorn", "controlplane.config.asgi:application",
                                "--host", "127.0.0.1", "--port", str(self.port), "--no-access-log",
                                "--log-level", "warning", "--backlog", "4096"],
                               cwd=ROOT, env=env, stdout=web_log, stderr=subprocess.STDOUT)  # fmt: skip
        self.procs, self.logs = [replica, web], [replica_log, web_log]
        self._wait_ready()

    def _wait_ready(self, timeout: float = 120) -> None:
        import httpx

        from workers.protocol import replica as protocol

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise SystemExit(f"a bench process exited early; see {self.dir}")
            ready = self.redis.hget(protocol.status_key(self.replica_id), "state") == "ready"
            try:
                web = httpx.get(f"{self.base}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                web = False
            if ready and web:
                return
            time.sleep(0.2)
        raise SystemExit(f"the bench platform did not start in {timeout}s; see {self.dir}")

    def close(self, keep: bool = False) -> None:
        stop(self.procs, self.logs)
        self.redis.flushdb()
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


class EngineAlone:
    """The same model stepping in this process, no Redis, no HTTP: the baseline."""

    def __init__(self, model: str, threads: int):
        import torch

        from workers.engine.config import EngineConfig
        from workers.engine.llm_engine import LLMEngine

        torch.set_num_threads(threads)
        self.engine = LLMEngine(EngineConfig(model=model, device="cpu", dtype="float32", enable_prefix_caching=False))
        self.runs = 0

    def stamps(self, prompt: str, tokens: int) -> tuple[float, list[float]]:
        """(start, the time each token came out)."""
        from workers.engine import SamplingParams

        self.runs += 1
        ids = self.engine.tokenizer.encode(prompt)
        start = time.perf_counter()
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        self.engine.add_request(f"r{self.runs}", ids, params)
        out = []
        while self.engine.has_unfinished_requests():
            if self.engine.step():
                out.append(time.perf_counter())
        return start, out


def path_stamps(client, prompt: str, tokens: int, delivery: list[float] | None = None) -> tuple[float, list[float]]:
    """(start, the time each token's SSE chunk arrived) through the whole serving path; with
    `delivery`, also each token's delivery latency (arrival minus when the replica produced it)."""
    body = {"model": "bench", "prompt": prompt, "max_tokens": tokens, "ignore_eos": True, "temperature": 0,
            "stream": True}  # fmt: skip
    start = time.perf_counter()
    out = []
    with client.stream("POST", "/v1/completions", json=body, headers={"x-switchyard-timing": "1"}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                out.append(time.perf_counter())
                if delivery is not None:
                    delivery.append(time.time() - json.loads(line[6:])["x_switchyard"]["replica_time"])
    if len(out) != tokens:
        raise SystemExit(f"expected {tokens} chunks, got {len(out)}")
    return start, out


def latency(platform: Platform, engine: EngineAlone, tokens: int, repeat: int) -> dict[str, tuple[list, list]]:
    """Gaps and TTFTs of both sides, measured alternately so that drift hits both alike."""
    import httpx

    sides = {"engine": ([], []), "path": ([], []), "delivery": ([], [])}
    headers = {"Authorization": f"Bearer {platform.api_key}"}
    with httpx.Client(base_url=platform.base, headers=headers, timeout=60) as client:
        for i in range(repeat + 1):  # round 0 warms both up
            delivery = sides["delivery"][0] if i else None
            for name in ("engine", "path"):
                if name == "engine":
                    start, stamps = engine.stamps("Hello", tokens)
                else:
                    start, stamps = path_stamps(client, "Hello", tokens, delivery)
                if i:
                    sides[name][0].extend(b - a for a, b in itertools.pairwise(stamps))
                    sides[name][1].append(stamps[0] - start)
    return sides


async def _one_stream(client, index: int, tokens: int) -> tuple[bool, str]:
    body = {
        "model": "bench",
        "prompt": f"Request {index}: hello",
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    chunks, done = 0, False
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return False, f"HTTP {r.status_code}: {(await r.aread())[:200].decode(errors='replace')}"
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: {"):
                    if '"error"' in line:
                        return False, line[:200]
                    chunks += 1
    except Exception as exc:  # report every way a stream can be lost
        return False, f"{type(exc).__name__}: {exc}"
    return (done and chunks == tokens), f"{chunks} chunks, done={done}"


async def concurrent_streams(platform: Platform, n: int, tokens: int) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
    headers = {"Authorization": f"Bearer {platform.api_key}"}
    async with httpx.AsyncClient(base_url=platform.base, headers=headers, timeout=300, limits=limits) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(_one_stream(client, i, tokens) for i in range(n)))
        elapsed = time.perf_counter() - start
    failures = [why for ok, why in results if not ok]
    return {
        "streams": n,
        "held": n - len(failures),
        "lost": len(failures),
        "seconds": round(elapsed, 2),
        "tokens_per_second": round((n - len(failures)) * tokens / elapsed, 1),
        "first_failure": failures[0] if failures else None,
    }


def run(args) -> int:
    from workers.demo import MODEL_DIR

    quiet = args.json
    model = str(args.model or MODEL_DIR)
    levels = [int(x) for x in args.streams.split(",")]
    log(f"model {model}; starting a replica ({args.threads} thread) and the web server...", quiet)
    platform = Platform(model, max_num_seqs=max(levels), threads=args.threads)
    try:
        sides = latency(platform, EngineAlone(model, args.threads), args.tokens, args.repeat)
        (eng_gaps, eng_ttft), (path_gaps, path_ttft) = sides["engine"], sides["path"]
        e50, p50 = statistics.median(eng_gaps), statistics.median(path_gaps)
        e90, p90 = percentile(eng_gaps, 0.9), percentile(path_gaps, 0.9)
        delivery = sides["delivery"][0]
        result = {
            "delivery_p50_ms": round(statistics.median(delivery) * 1000, 3),
            "delivery_p90_ms": round(percentile(delivery, 0.9) * 1000, 3),
            "engine_itl_p50_ms": round(e50 * 1000, 3),
            "path_itl_p50_ms": round(p50 * 1000, 3),
            "added_itl_p50_ms": round((p50 - e50) * 1000, 3),
            "engine_itl_p90_ms": round(e90 * 1000, 3),
            "path_itl_p90_ms": round(p90 * 1000, 3),
            "added_itl_p90_ms": round((p90 - e90) * 1000, 3),
            "engine_ttft_ms": round(statistics.median(eng_ttft) * 1000, 3),
            "path_ttft_ms": round(statistics.median(path_ttft) * 1000, 3),
        }
        result["added_ttft_ms"] = round(result["path_ttft_ms"] - result["engine_ttft_ms"], 3)
        log(
            f"delivery latency per token (replica produced -> client received): p50 {result['delivery_p50_ms']} ms, "
            f"p90 {result['delivery_p90_ms']} ms (target p50 <= 1 ms)",
            quiet,
        )
        log(
            f"inter-token gap (p50/p90): engine {result['engine_itl_p50_ms']}/{result['engine_itl_p90_ms']} ms, "
            f"full path {result['path_itl_p50_ms']}/{result['path_itl_p90_ms']} ms -> added "
            f"{result['added_itl_p50_ms']} ms p50; TTFT engine {result['engine_ttft_ms']} ms, "
            f"full path {result['path_ttft_ms']} ms",
            quiet,
        )
        held = 0
        result["concurrency"] = []
        for n in levels:
            level = asyncio.run(concurrent_streams(platform, n, args.stream_tokens))
            result["concurrency"].append(level)
            log(
                f"{n} concurrent streams x {args.stream_tokens} tokens: held {level['held']}, lost {level['lost']} "
                f"in {level['seconds']} s ({level['tokens_per_second']} tok/s)"
                + (f"; first failure: {level['first_failure']}" if level["first_failure"] else ""),
                quiet,
            )
            if level["lost"] == 0:
                held = max(held, n)
        result["max_streams_held"] = held
        log(f"held {held} concurrent streams with none lost (target >= 200)", quiet)
    finally:
        lost = any(level["lost"] for level in result.get("concurrency", [])) if "result" in locals() else True
        platform.close(keep=lost)
        if lost:
            log(f"logs kept in {platform.dir}", quiet)
    print(json.dumps(result))
    return 0
