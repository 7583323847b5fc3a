"""`python -m workers.bench batch [--json] [--chaos]`: the Batch API on spare capacity, and fair
sharing between tenants, on one `make run` stack with its own Redis.

Simulated replicas (engine sim, the `bench-slow` profile: 50 ms decode steps plus 5 ms per
sequence, so that on a 2-core machine the replicas, not the gateway, run out) run the real
scheduler, with its priorities and fair sharing. Phases, one after the other:
1. capacity: as many streamed chats as the two replicas hold sequences, each sent again as soon as
   it ends, for `--calibration` seconds: the deployment's token throughput (C, the tokens streamed
   after the first quarter of the time).
2. `interactive_alone`: streamed chats (a ~100-token prompt, 32 tokens out) arriving as a Poisson
   process at `--rate` requests/s for `--seconds`: TTFT and ITL p90, and their throughput (I).
3. `interactive_with_batch`: the deployment is given a TTFT SLO of `--slo` times phase 2's p90
   as the gateway measured it (its autoscaling settings; autoscaling stays off), under which the
   dispatcher paces the batch's lines (controlplane/batches/slo_gate.py), up to `--fill` of the
   slots. A `--lines`-line batch (32 tokens per line, as the interactive requests) is created,
   then the same trace (same seed). `batch.tok_s`: the batch's tokens per second while the
   interactive load ran; `spare_capacity_used` = that / (C - I). The batch then runs to its end;
   its output file is checked: every custom_id once (`duplicates`, `missing`), every line
   answered 200 (`failed`).
   With `--chaos`, a replica and the control worker are killed (SIGKILL) once a quarter of the
   lines are answered; make run's supervisor starts the worker again, the agent the replica.
4. `fairness`: one replica (at most 4 sequences) and two tenants (API keys of two users): a heavy
   one sending 10x the light one's rate, both for `--fair-seconds`, first with `fair_share` off
   (first come, first served), then on. A share is the light tenant's tokens served within the
   window over its fair share: min(what it asked for, half of all tokens served).
Last line: {"interactive_alone": {"ttft_p90_ms", "itl_p90_ms"}, "interactive_with_batch": {...},
"batch": {"lines", "completed", "failed", "duplicates", "missing", "tok_s", "spare_capacity_used"},
"fairness": {"fifo_share", "vtc_share"}}.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import httpx

from workers.bench.autoscale import PROMPT, Sent, api, arrivals, log, send, settle
from workers.bench.chaos import Stack
from workers.bench.processes import ROOT, environ, percentile

SLUG, FAIR_SLUG = "batched", "shared"
PROFILE = "bench-slow"
REPLICAS, MAX_NUM_SEQS = 2, 8
FAIR_MAX_NUM_SEQS = 4
# A batch line is shaped like the interactive requests the capacity was measured with (the same
# prompt length, as many tokens out): otherwise the comparison counts its prefills against it.
INTERACTIVE_TOKENS, LINE_TOKENS, FAIR_TOKENS = 32, 32, 16


def lines_file(n: int) -> bytes:
    rows = [{"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": SLUG, "messages": [{"role": "user", "content": f"Summarise document {i}. {PROMPT}"}],
                      "max_tokens": LINE_TOKENS, "ignore_eos": True}} for i in range(n)]  # fmt: skip
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


class Batches:
    """The Batch API, as a client of the stack uses it."""

    def __init__(self, stack: Stack, http: httpx.AsyncClient):
        self.stack, self.http = stack, http
        self.headers = {"Authorization": f"Bearer {stack.key}"}

    async def create(self, n: int) -> dict:
        files = {"file": ("docs.jsonl", lines_file(n), "application/jsonl")}
        f = await self.http.post(
            f"{self.stack.base}/v1/files", data={"purpose": "batch"}, files=files, headers=self.headers
        )
        f.raise_for_status()
        body = {"input_file_id": f.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        batch = await self.http.post(f"{self.stack.base}/v1/batches", json=body, headers=self.headers)
        batch.raise_for_status()
        if batch.json()["status"] != "in_progress":
            raise SystemExit(f"the batch was not accepted: {batch.json()}")
        return batch.json()

    async def get(self, batch_id: str) -> dict:
        r = await self.http.get(f"{self.stack.base}/v1/batches/{batch_id}", headers=self.headers)
        r.raise_for_status()
        return r.json()

    async def wait(self, batch_id: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            batch = await self.get(batch_id)
            if batch["status"] in ("completed", "failed", "expired", "cancelled"):
                return batch
            await asyncio.sleep(0.5)
        raise SystemExit(f"batch {batch_id} did not end within {timeout:g} s; see {self.stack.dir}")

    async def content(self, file_id: str | None) -> list[dict]:
        if file_id is None:
            return []
        r = await self.http.get(f"{self.stack.base}/v1/files/{file_id}/content", headers=self.headers)
        r.raise_for_status()
        return [json.loads(row) for row in r.text.splitlines()]


async def saturate(stack: Stack, http: httpx.AsyncClient, seconds: float) -> float:
    """The deployment's tokens/s with every sequence slot busy (see the module's docstring). Each
    request's tokens count in proportion to the part of its streaming (first token to last) that
    falls in the window: the slots run in step, so counting whole requests by when they end
    would count a whole round of them in or out by chance."""
    started = time.monotonic()
    window = (started + seconds / 4, started + seconds)
    streamed: list[Sent] = []

    async def loop(n: int) -> None:
        i = 0
        while time.monotonic() < window[1]:
            rec = await send(http, stack, 100_000 * n + i, slug=SLUG, max_tokens=INTERACTIVE_TOKENS)
            if rec.ok and rec.first is not None and rec.last is not None:
                streamed.append(rec)
            i += 1

    await asyncio.gather(*(loop(n) for n in range(REPLICAS * MAX_NUM_SEQS)))
    tokens = 0.0
    for rec in streamed:
        inside = max(0.0, min(rec.last, window[1]) - max(rec.first, window[0]))
        tokens += rec.tokens * (inside / (rec.last - rec.first) if rec.last > rec.first else float(inside > 0))
    return tokens / (window[1] - window[0])


async def interactive(stack: Stack, http: httpx.AsyncClient, trace: list[float]) -> tuple[dict, float, float]:
    """The streamed chat load: ({ttft_p90_ms, itl_p90_ms}, its tokens/s, how long it ran)."""
    started = time.monotonic()

    async def at(offset: float, i: int) -> Sent:
        await asyncio.sleep(max(0.0, started + offset - time.monotonic()))
        return await send(http, stack, i, slug=SLUG, max_tokens=INTERACTIVE_TOKENS)

    sent = await asyncio.gather(*(at(offset, i) for i, offset in enumerate(trace)))
    took = time.monotonic() - started
    ok = [r for r in sent if r.ok]
    itls = [r.itl_ms for r in ok if r.itl_ms is not None]
    result = {
        "ttft_p90_ms": round(percentile([r.ttft_ms for r in ok], 0.9), 1) if ok else None,
        "itl_p90_ms": round(percentile(itls, 0.9), 1) if itls else None,
    }
    if len(ok) < len(sent):
        failed = next(r for r in sent if not r.ok)
        result["failed"] = len(sent) - len(ok)
        print(f"interactive: {len(sent) - len(ok)} of {len(sent)} failed, first: {failed.error}", file=sys.stderr)
    return result, sum(r.tokens for r in ok) / took, took


async def chaos(stack: Stack, batches: Batches, batch: dict, quiet: bool) -> None:
    """Once a quarter of the lines are answered: SIGKILL a replica and the control worker."""
    while (await batches.get(batch["id"]))["request_counts"]["completed"] < batch["request_counts"]["total"] // 4:
        await asyncio.sleep(0.2)
    rows = (await api(stack, "GET", f"replicas/?deployment__slug={SLUG}&state=ready"))["results"]
    control = stack.process("control")
    if rows and rows[0].get("pid"):
        os.kill(rows[0]["pid"], signal.SIGKILL)
    if control is not None:
        control.kill()
    log(f"chaos: killed replica {rows[0]['id'] if rows else None} and the control worker", quiet)


async def batch_phase(stack, http, trace, capacity, args) -> tuple[dict, dict]:
    batches = Batches(stack, http)
    batch = await batches.create(args.lines)
    before = await batches.get(batch["id"])
    killer = asyncio.create_task(chaos(stack, batches, batch, args.json)) if args.chaos else None
    loaded, interactive_tok_s, took = await interactive(stack, http, trace)
    during = await batches.get(batch["id"])
    done = await batches.wait(batch["id"], 1800)
    if killer is not None:
        killer.cancel()
    rows = await batches.content(done["output_file_id"])
    errors = await batches.content(done["error_file_id"])
    ids = Counter(row["custom_id"] for row in rows + errors)
    answered = during["request_counts"]["completed"] - before["request_counts"]["completed"]
    tok_s = answered * LINE_TOKENS / took
    spare = capacity - interactive_tok_s
    result = {
        "lines": args.lines,
        "completed": sum(1 for row in rows if (row.get("response") or {}).get("status_code") == 200),
        "failed": len(errors) + sum(1 for row in rows if (row.get("response") or {}).get("status_code") != 200),
        "duplicates": sum(n - 1 for n in ids.values() if n > 1),
        "missing": len({f"doc-{i}" for i in range(args.lines)} - set(ids)),
        "tok_s": round(tok_s, 1),
        "spare_capacity_used": round(tok_s / spare, 3) if spare > 0 else None,
    }
    log(
        f"batch: {json.dumps(result)}; {done['status']}; interactive {interactive_tok_s:.1f} tok/s, "
        f"capacity {capacity:.1f} tok/s",
        args.json,
    )
    return loaded, result


def second_tenant(stack: Stack) -> str:
    """An API key of another user (another tenant), made with manage.py in the stack's settings."""
    code = (
        "from django.contrib.auth import get_user_model; from controlplane.gateway.services import create_api_key; "
        "u, _ = get_user_model().objects.get_or_create(username='light-tenant'); "
        "print(create_api_key(name='light', owner=u)[1])"
    )
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=stack.env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout.strip().splitlines()[-1]


async def fairness_run(stack, http, light_key: str, fair: bool, seconds: float, quiet: bool) -> float:
    """The light tenant's share (see the module's docstring) with fair sharing on or off."""
    await api(stack, "PATCH", f"deployments/{FAIR_SLUG}/", {"fair_share": fair})
    await api(stack, "POST", f"deployments/{FAIR_SLUG}/restart/")
    await asyncio.sleep(2)
    await settle(stack, 1, slug=FAIR_SLUG)
    heavy_trace = arrivals(seconds, 10.0, 10.0, seed=11)
    light_trace = arrivals(seconds, 1.0, 1.0, seed=12)
    started = time.monotonic()
    served = {"heavy": 0, "light": 0}

    async def at(offset: float, i: int, tenant: str, key: str | None) -> None:
        await asyncio.sleep(max(0.0, started + offset - time.monotonic()))
        rec = await send(http, stack, i, slug=FAIR_SLUG, max_tokens=FAIR_TOKENS, key=key)
        if rec.ok and time.monotonic() - started <= seconds:
            served[tenant] += rec.tokens

    tasks = [asyncio.create_task(at(t, i, "heavy", None)) for i, t in enumerate(heavy_trace)]
    tasks += [asyncio.create_task(at(t, 10_000 + i, "light", light_key)) for i, t in enumerate(light_trace)]
    await asyncio.sleep(seconds)
    for task in tasks:  # the window is over: what was not served by now does not count
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    asked = len(light_trace) * FAIR_TOKENS
    fair_share = min(asked, (served["heavy"] + served["light"]) / 2)
    share = served["light"] / fair_share if fair_share else float("nan")
    log(f"fairness ({'vtc' if fair else 'fifo'}): served {served}, light asked {asked} -> share {share:.2f}", quiet)
    return round(share, 3)


async def _main(args) -> dict:
    quiet = args.json
    trace = arrivals(args.seconds, args.rate, args.rate, args.seed)
    with environ(
        CPU_REPLICAS_PER_DEVICE=str(REPLICAS + 2),
        TELEMETRY_INTERVAL="1",
        BATCH_DISPATCH_INTERVAL="1",
        BATCH_FILL=str(args.fill),
    ):
        log("starting make run on its own Redis", quiet)
        stack = Stack(quiet, hang_seconds=30.0)
    try:
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(300, connect=10), limits=httpx.Limits(max_connections=None)
        ) as http:
            await api(stack, "PATCH", "deployments/demo/", {"replicas": 0})  # its CPU for the simulated replicas
            await api(stack, "POST", "deployments/", {"slug": SLUG, "model": "demo", "replicas": REPLICAS,
                                                      "engine": "sim", "sim_profile": PROFILE,
                                                      "max_num_seqs": MAX_NUM_SEQS})  # fmt: skip
            await settle(stack, REPLICAS, slug=SLUG)
            capacity = await saturate(stack, http, args.calibration)
            log(f"capacity: {capacity:.1f} tok/s with every sequence slot busy", quiet)
            alone_from = time.time()
            interactive_alone, tok_s, _ = await interactive(stack, http, trace)
            log(f"interactive alone: {json.dumps(interactive_alone)}, {tok_s:.1f} tok/s", quiet)
            # The SLO is on the TTFT the platform measures (from the gateway taking the request to
            # its first token), the one it can see: the last requests' in the inspector.
            recent = (await api(stack, "GET", f"deployments/{SLUG}/requests/"))["results"]
            ttfts = [r["ttft_ms"] for r in recent if r.get("ttft_ms") is not None and r["at"] >= alone_from]
            if args.slo and not ttfts:
                log("no interactive request was answered alone: the batch runs without a TTFT SLO", quiet)
            elif args.slo:
                measured = percentile(ttfts, 0.9)
                slo = round(args.slo * measured, 1)
                await api(stack, "PATCH", f"deployments/{SLUG}/autoscaling/", {"ttft_p90_ms": slo})
                log(
                    f"the deployment's TTFT SLO: {slo} ms ({args.slo} x the gateway's p90 {measured:.1f} ms alone); "
                    f"batch lines take up to {args.fill} of the slots",
                    quiet,
                )
            with_batch, batch = await batch_phase(stack, http, trace, capacity, args)
            log(f"interactive with the batch: {json.dumps(with_batch)}", quiet)

            await api(stack, "POST", f"deployments/{SLUG}/scale/", {"replicas": 0})
            await api(stack, "POST", "deployments/", {"slug": FAIR_SLUG, "model": "demo", "replicas": 1,
                                                      "engine": "sim", "sim_profile": PROFILE,
                                                      "max_num_seqs": FAIR_MAX_NUM_SEQS})  # fmt: skip
            light_key = second_tenant(stack)
            fifo = await fairness_run(stack, http, light_key, False, args.fair_seconds, quiet)
            vtc = await fairness_run(stack, http, light_key, True, args.fair_seconds, quiet)
    finally:
        stack.close(keep=args.keep)
    if not quiet and interactive_alone["ttft_p90_ms"] and with_batch["ttft_p90_ms"]:
        ratio = with_batch["ttft_p90_ms"] / interactive_alone["ttft_p90_ms"]
        print(
            f"interactive TTFT p90 with the batch: {ratio:.2f}x alone (target <= 1.25); the batch used "
            f"{batch['spare_capacity_used']} of the spare capacity (target >= 0.7); light tenant's share "
            f"{fifo} first come first served, {vtc} with fair sharing (target >= 0.5)"
        )
    return {
        "interactive_alone": {k: interactive_alone[k] for k in ("ttft_p90_ms", "itl_p90_ms")},
        "interactive_with_batch": {k: with_batch[k] for k in ("ttft_p90_ms", "itl_p90_ms")},
        "batch": batch,
        "fairness": {"fifo_share": fifo, "vtc_share": vtc},
    }


def run(args) -> int:
    print(json.dumps(asyncio.run(_main(args))))
    return 0
