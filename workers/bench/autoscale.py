"""`python -m workers.bench autoscale [--json] [--seconds N]`: the autoscaler against fixed replica
counts, on one `make run` stack with its own Redis and a simulated deployment (engine sim).

The load is open-loop: streamed chat requests (a ~100-token prompt, 32 tokens out) arriving as a
Poisson process whose rate rises from `--low` to `--high` requests/s and falls back, as a sine,
over `--seconds`. The deployment's replicas run the `bench-slow` profile (50 ms decode steps, at
most 8 sequences), so that on a 2-core machine the replicas, not the gateway, run out. The same
trace (same seed) runs under three policies, one after the other:
- `static_peak`: the autoscaler's maximum throughout;
- `autoscaled` (run first): from its minimum, the autoscaler active (AUTOSCALE_INTERVAL 3 s here);
- `static_mean`: the mean of the replicas the autoscaled run had ready, rounded up.
Per run: `slo_attainment` (requests that succeeded within both SLOs: TTFT, and the mean gap
between their tokens against the ITL SLO), `replica_seconds` (ready replicas sampled every 0.5 s,
integrated), TTFT and ITL p90, `failed` and the autoscaler's `decisions` (scaling events).
Last line: {"runs": {policy: {"slo_attainment", "replica_seconds", "ttft_p90_ms", "itl_p90_ms",
"failed", "decisions"}}, "pd_shift": {...}}; `pd_shift` is null throughout: autoscaling the
prefill and decode pools of a disaggregated deployment is not built yet.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import time
from dataclasses import dataclass, field

import httpx

from workers.bench.chaos import Stack
from workers.bench.processes import environ, percentile

SLUG = "auto"
PROFILE = "bench-slow"
MAX_NUM_SEQS = 8
MIN_REPLICAS, MAX_REPLICAS = 1, 4
TTFT_SLO_MS, ITL_SLO_MS = 2000.0, 150.0
OUTPUT_TOKENS = 32
PROMPT = "Summarise the routing of requests between replicas in a fleet of inference servers. " * 6


@dataclass
class Sent:
    start: float
    expected: int = OUTPUT_TOKENS  # tokens it asked for (ignore_eos: it gets them all)
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    error: str | None = None
    times: list[float] = field(default_factory=list)

    @property
    def ttft_ms(self) -> float | None:
        return (self.first - self.start) * 1000 if self.first is not None else None

    @property
    def itl_ms(self) -> float | None:
        if self.first is None or self.last is None or self.tokens < 2:
            return None
        return (self.last - self.first) * 1000 / (self.tokens - 1)

    @property
    def ok(self) -> bool:
        return self.error is None and self.tokens == self.expected

    def within_slo(self) -> bool:
        return self.ok and self.ttft_ms <= TTFT_SLO_MS and (self.itl_ms or 0) <= ITL_SLO_MS


def log(message: str, quiet: bool) -> None:
    if not quiet:
        print(message, flush=True)


async def send(http: httpx.AsyncClient, stack: Stack, i: int, slug: str = SLUG, max_tokens: int = OUTPUT_TOKENS,
               key: str | None = None) -> Sent:  # fmt: skip
    """One streamed chat request of `max_tokens` tokens, timed token by token (with `key`, or the stack's)."""
    rec = Sent(start=time.monotonic(), expected=max_tokens)
    body = {"model": slug, "messages": [{"role": "user", "content": f"{i}: {PROMPT}"}], "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    return await stream_chat(http, stack, body, rec, key)


async def stream_chat(http: httpx.AsyncClient, stack: Stack, body: dict, rec: Sent, key: str | None = None) -> Sent:
    """POST `body` (a streamed chat completion, usage included) and time its answer into `rec`:
    the first and last token (content or tool-call text), the tokens, an error."""
    try:
        async with http.stream(
            "POST",
            f"{stack.base}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key or stack.key}"},
        ) as response:
            if response.status_code != 200:
                rec.error = f"{response.status_code}: {(await response.aread()).decode(errors='replace')[:200]}"
                return rec
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    rec.error = str(chunk["error"])[:200]
                if chunk.get("usage"):
                    rec.tokens = chunk["usage"]["completion_tokens"]
                deltas = [c.get("delta") or {} for c in chunk.get("choices") or []]
                if any(d.get("content") or d.get("tool_calls") for d in deltas):
                    now = time.monotonic()
                    rec.first = rec.first or now
                    rec.last = now
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
    return rec


def arrivals(seconds: float, low: float, high: float, seed: int) -> list[float]:
    """Poisson arrival times with rate low + (high - low)·sin²(π t / seconds) (by thinning)."""
    rng, times, t = random.Random(seed), [], 0.0
    while True:
        t += rng.expovariate(high)
        if t >= seconds:
            return times
        if rng.random() < (low + (high - low) * math.sin(math.pi * t / seconds) ** 2) / high:
            times.append(t)


async def replica_counter(stack: Stack, stop: asyncio.Event, samples: list[tuple[float, int]]) -> None:
    while not stop.is_set():
        try:
            status, body = await stack.api("GET", f"replicas/?deployment__slug={SLUG}&state=ready")
            if status == 200:
                samples.append((time.monotonic(), body.get("count", len(body.get("results", [])))))
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.5)


async def api(stack: Stack, method: str, path: str, body: dict | None = None) -> dict:
    status, answer = await stack.api(method, path, body)
    if status >= 300:
        raise SystemExit(f"{method} /api/v1/{path}: {status} {answer}")
    return answer


async def settle(stack: Stack, replicas: int, timeout: float = 120, slug: str = SLUG) -> None:
    """Wait until `slug` has exactly `replicas` ready replicas and none coming or going."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = (await api(stack, "GET", f"replicas/?deployment__slug={slug}")).get("results", [])
        states = [r["state"] for r in rows]
        if states.count("ready") == replicas and not {"pending", "starting", "draining"} & set(states):
            return
        await asyncio.sleep(0.5)
    raise SystemExit(f"{slug} did not settle at {replicas} replicas; see {stack.dir}")


async def one_run(stack: Stack, policy: str, replicas: int, trace: list[float], quiet: bool) -> dict:
    auto = {"enabled": policy == "autoscaled", "mode": "active", "min_replicas": MIN_REPLICAS,
            "max_replicas": MAX_REPLICAS, "ttft_p90_ms": TTFT_SLO_MS, "itl_p90_ms": ITL_SLO_MS,
            "scale_down_cooldown_seconds": 20}  # fmt: skip
    await api(stack, "PATCH", f"deployments/{SLUG}/autoscaling/", {**auto, "enabled": False})
    await api(stack, "POST", f"deployments/{SLUG}/scale/", {"replicas": replicas})
    await settle(stack, replicas)
    events_before = (await api(stack, "GET", "events/?verb=autoscaling.scaled"))["count"]
    await api(stack, "PATCH", f"deployments/{SLUG}/autoscaling/", auto)
    log(f"{policy}: {len(trace)} requests over {trace[-1]:.0f} s from {replicas} replica(s)", quiet)
    stop, samples = asyncio.Event(), []
    counter = asyncio.create_task(replica_counter(stack, stop, samples))
    started = time.monotonic()
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(300, connect=10), limits=httpx.Limits(max_connections=None)
    ) as http:

        async def at(offset: float, i: int) -> Sent:
            await asyncio.sleep(max(0.0, started + offset - time.monotonic()))
            return await send(http, stack, i)

        sent = await asyncio.gather(*(at(offset, i) for i, offset in enumerate(trace)))
    stop.set()
    await counter
    await api(stack, "PATCH", f"deployments/{SLUG}/autoscaling/", {"enabled": False})
    decisions = (await api(stack, "GET", "events/?verb=autoscaling.scaled"))["count"] - events_before
    replica_seconds = sum((b[0] - a[0]) * a[1] for a, b in itertools.pairwise(samples))
    ttfts = [r.ttft_ms for r in sent if r.ok]
    itls = [r.itl_ms for r in sent if r.ok and r.itl_ms is not None]
    failed = [r for r in sent if not r.ok]
    result = {
        "slo_attainment": round(sum(r.within_slo() for r in sent) / len(sent), 4),
        "replica_seconds": round(replica_seconds, 1),
        "ttft_p90_ms": round(percentile(ttfts, 0.9), 1) if ttfts else None,
        "itl_p90_ms": round(percentile(itls, 0.9), 1) if itls else None,
        "failed": len(failed),
        "decisions": decisions,
        "mean_replicas": replica_seconds / (samples[-1][0] - samples[0][0]) if len(samples) > 1 else None,
    }
    log(f"{policy}: {json.dumps(result)}" + (f"; first failure: {failed[0].error}" if failed else ""), quiet)
    return result


async def _main(args) -> dict:
    quiet = args.json
    trace = arrivals(args.seconds, args.low, args.high, args.seed)
    with environ(CPU_REPLICAS_PER_DEVICE=str(MAX_REPLICAS + 1), AUTOSCALE_INTERVAL="3", TELEMETRY_INTERVAL="1"):
        log("starting make run on its own Redis", quiet)
        stack = Stack(quiet, hang_seconds=30.0)
    runs = {}
    try:
        await api(stack, "PATCH", "deployments/demo/", {"replicas": 0})  # its CPU for the simulated replicas
        await api(stack, "POST", "deployments/", {"slug": SLUG, "model": "demo", "replicas": MIN_REPLICAS,
                                                  "engine": "sim", "sim_profile": PROFILE,
                                                  "max_num_seqs": MAX_NUM_SEQS})  # fmt: skip
        await settle(stack, MIN_REPLICAS)
        # autoscaled first: static_mean runs the mean of the replicas it used, rounded up.
        for policy in ("autoscaled", "static_peak", "static_mean"):
            if policy not in args.policies.split(","):
                continue
            if policy == "static_mean":
                used = runs.get("autoscaled", {}).get("mean_replicas") or (MIN_REPLICAS + MAX_REPLICAS) / 2
                replicas = min(MAX_REPLICAS, max(MIN_REPLICAS, math.ceil(used - 1e-9)))
            else:
                replicas = MAX_REPLICAS if policy == "static_peak" else MIN_REPLICAS
            runs[policy] = await one_run(stack, policy, replicas, trace, quiet)
        for result in runs.values():
            result.pop("mean_replicas", None)
    finally:
        stack.close(keep=args.keep)
    if not quiet and "static_peak" in runs and "autoscaled" in runs:
        peak, auto = runs["static_peak"], runs["autoscaled"]
        ratio = auto["replica_seconds"] / peak["replica_seconds"] if peak["replica_seconds"] else float("nan")
        print(
            f"autoscaled: SLO attainment {auto['slo_attainment']:.1%} with {ratio:.2f}x static_peak's "
            f"replica-seconds (static_peak {peak['slo_attainment']:.1%})"
        )
    pd_shift = dict.fromkeys(("prefill_moved", "decode_moved", "opposite", "intervals_to_react"))
    return {"runs": runs, "pd_shift": pd_shift}


def run(args) -> int:
    print(json.dumps(asyncio.run(_main(args))))
    return 0
