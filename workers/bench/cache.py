"""Cache benchmark: how much of an agent trace's prompts each routing policy serves from cache.

It runs the product as an operator would (`make run` on a temporary state directory and its own
Redis, as the chaos benchmark does: `chaos.Stack`), scales the demo deployment to zero, registers
a random-weight 8k-context checkpoint (`SHAPE`, made offline, with the demo model's tokenizer)
and deploys it with four CPU replicas of one torch thread each and `KV_CACHE_BYTES` of KV cache
each (finite: a replica holds a few sessions' contexts, so a policy that scatters sessions makes
it evict). Then it replays the seeded agent trace (`agent_trace.py`) through the gateway once
per routing policy, switching the cache policy's `routing` through the REST API between runs:

- `round_robin`, `least_loaded`: no session header;
- `session`: each request carries its session key in `x-session-affinity`;
- `kv_aware`: no header (the gateway reads the blocks of the prompt each replica holds);
- `session+kv_aware`: the header, and an unbound key placed where its prefix is.

Requests are `/v1/completions` with the prompt as token ids (the gateway has the ids it routes
on), streamed with usage, `OUTPUT_TOKENS` greedy tokens each with `ignore_eos`. Sessions run
concurrently; each session's turns in order, a think time after each answer; sub-agents start
from their parent's context, concurrently with it.

Between two policies the replicas' caches must not help the next one. By default each run
relabels the trace's tokens (one bijection of the token range per run, `_relabel`): the prompts
have the same lengths and the same shared prefixes as every other run's, but no block of
another run's. That is a reset: the engine evicts least recently used blocks first, and every
block of an earlier run was freed before this run began. `--restart` scales the deployment to
zero and back instead (fresh processes, slower).

Per policy: input-token hit rate (Σ cached_tokens / Σ prompt_tokens from usage), the trace's ideal
hit rate (infinite cache, perfect routing: `Trace.ideal_hit_rate`), TTFT p50/p90 (first streamed
token), output tokens/s over the replay, and load imbalance (max/mean requests per replica, from
`x-switchyard-replica`). The last line is one JSON object:
{"policies": {policy: {"hit_rate", "ideal_hit_rate", "ttft_p50_ms", "ttft_p90_ms", "tok_s", "imbalance"}}}.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from workers.bench.agent_trace import HIGH_TOKEN, LOW_TOKEN, QUICK, Session, Shape, Trace, make_trace
from workers.bench.chaos import Stack
from workers.bench.checkpoints import random_checkpoint
from workers.bench.processes import environ, percentile
from workers.demo import MODEL_DIR
from workers.protocol.replica import status_key

POLICIES = ("round_robin", "least_loaded", "session", "kv_aware", "session+kv_aware")
HEADER_POLICIES = ("session", "session+kv_aware")
SLUG, MODEL_NAME, CACHE_POLICY = "agents", "agents-8k", "agents-cache"
SESSION_HEADER = "x-session-affinity"
REPLICAS = 4
BLOCK_SIZE = 16
OUTPUT_TOKENS = 8
MAX_MODEL_LEN = 8192
# 96 MiB a replica: 1536 blocks of 16 tokens (this model's KV is 4 KiB a token: 4 layers × 2 KV
# heads × 64 × K and V × fp32), the contexts of five to seven sessions. The trace has up to 20
# sessions alive at once; scattered by round robin, a replica computes some 4k distinct blocks and
# must evict, kept together by session affinity about 1.1k–1.7k.
KV_CACHE_BYTES = 96 << 20
# Small enough that a 4k-token prefill takes ~0.8 s on one idle core (a replica's longest step
# stays under the 3 s after which its heartbeat is stale) and the whole benchmark fits in ~10
# minutes on two cores; 8k positions; the demo tokenizer's vocabulary.
SHAPE = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1031,
    max_position_embeddings=MAX_MODEL_LEN,
    tie_word_embeddings=True,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
READY_TIMEOUT = 240.0
# The gateway's routing-quality sums (/metrics): what the best replica the load bound allowed
# held, over the prompt tokens of the decisions.
REACHABLE, ROUTED = "switchyard_routing_reachable_cached_tokens_total", "switchyard_routing_input_tokens_total"


def log(message: str, quiet: bool) -> None:
    if not quiet:
        print(message, flush=True)


def bench_model() -> Path:
    """The random checkpoint (made once, cached), with the demo model's tokenizer beside it so
    that the catalog accepts it and the replicas can detokenize."""
    directory = random_checkpoint("cache-bench-h256-l4-8k", SHAPE)
    for name in TOKENIZER_FILES:
        if not (directory / name).is_file():
            shutil.copy(MODEL_DIR / name, directory / name)
    return directory


@dataclass
class Result:
    session: int
    turn: int
    sent: float
    first: float | None = None
    end: float = 0.0
    replica: int | None = None
    reason: str = ""
    predicted: int | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    tokens: int = 0
    error: str | None = None


def _relabel(tokens: list[int], offset: int) -> list[int]:
    """The same prompt in another alphabet: a rotation of the trace's token range."""
    span = HIGH_TOKEN - LOW_TOKEN
    return [LOW_TOKEN + (t - LOW_TOKEN + offset) % span for t in tokens]


class Bench:
    """The stack, the benchmark's deployment and cache policy, and one replay per policy."""

    def __init__(self, stack: Stack, trace: Trace, quiet: bool):
        self.stack, self.trace, self.quiet = stack, trace, quiet
        self.policy_id: int | None = None
        self.runs = 0
        self.kv_blocks = 0  # each replica's KV capacity, in blocks (its heartbeat's kv_blocks_total)

    async def _api(self, method: str, path: str, body: dict | None = None) -> dict:
        status, answer = await self.stack.api(method, path, body)
        if status >= 300:
            raise SystemExit(f"{method} /api/v1/{path}: {status} {answer}")
        return answer

    async def replicas(self) -> list[dict]:
        answer = await self._api("GET", f"replicas/?deployment__slug={SLUG}")
        return answer.get("results", [])

    async def wait_replicas(self, ready: int, timeout: float = READY_TIMEOUT) -> list[int]:
        """Wait until exactly `ready` replicas are ready and none is on its way in or out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = await self.replicas()
            states = [r["state"] for r in rows]
            if states.count("ready") == ready and not {"pending", "starting", "draining"} & set(states):
                return sorted(r["id"] for r in rows if r["state"] == "ready")
            if "failed" in states:
                raise SystemExit(f"a replica of {SLUG} failed; see {self.stack.dir}")
            await asyncio.sleep(0.5)
        raise SystemExit(f"{SLUG} did not reach {ready} ready replicas in {timeout:g} s; see {self.stack.dir}")

    async def setup(self) -> list[int]:
        await self._api("PATCH", "deployments/demo/", {"replicas": 0})  # its CPU slot and cycles
        source = Path(self.stack.dir) / "state" / "models" / MODEL_NAME  # under MODEL_ROOTS
        shutil.copytree(bench_model(), source)
        model = await self._api("POST", "models/", {"name": MODEL_NAME, "source": str(source), "source_type": "local"})
        deadline = time.monotonic() + 60
        while (model := await self._api("GET", f"models/{model['id']}/"))["status"] != "ready":
            if model["status"] == "error" or time.monotonic() > deadline:
                raise SystemExit(f"model {MODEL_NAME} not ready: {model['status']} {model.get('status_message')}")
            await asyncio.sleep(0.5)
        policy = await self._api(
            "POST", "cache-policies/", {"name": CACHE_POLICY, "block_size": BLOCK_SIZE, "routing": "round_robin"}
        )
        self.policy_id = policy["id"]
        deployment = {
            "slug": SLUG,
            "model": MODEL_NAME,
            "replicas": REPLICAS,
            "max_model_len": MAX_MODEL_LEN,
            "cache_policy": CACHE_POLICY,
        }
        await self._api("POST", "deployments/", deployment)
        ids = await self.wait_replicas(REPLICAS)
        client = aioredis.from_url(self.stack.redis.url, decode_responses=True)
        loads = [json.loads(await client.hget(status_key(rid), "load") or "{}") for rid in ids]
        await client.aclose()
        self.kv_blocks = min(int(load.get("kv_blocks_total", 0)) for load in loads)
        return ids

    async def restart(self) -> list[int]:
        await self._api("POST", f"deployments/{SLUG}/scale/", {"replicas": 0})
        await self.wait_replicas(0)
        await self._api("POST", f"deployments/{SLUG}/scale/", {"replicas": REPLICAS})
        return await self.wait_replicas(REPLICAS)

    async def set_routing(self, policy: str) -> None:
        await self._api("PATCH", f"cache-policies/{self.policy_id}/", {"routing": policy})

    async def warm_up(self, http: httpx.AsyncClient) -> None:
        """Two requests per replica (round robin), on tokens outside the trace's range, so that
        no policy pays for a replica's first steps."""
        await self.set_routing("round_robin")
        prompt = list(range(HIGH_TOKEN, HIGH_TOKEN + 24)) * 24
        for i in range(2):
            calls = [self._request(http, [*prompt[j:], j + i], None) for j in range(REPLICAS)]
            for result in await asyncio.gather(*calls):
                if result.error:
                    raise SystemExit(f"warm-up request failed: {result.error}")

    async def counters(self, http: httpx.AsyncClient) -> dict[str, float]:
        token = os.environ.get("METRICS_TOKEN")  # make run's web process inherits it
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        text = (await http.get(f"{self.stack.base}/metrics", headers=headers)).text
        return {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name in (REACHABLE, ROUTED) and sample.labels.get("deployment") == SLUG
        }

    async def _request(
        self, http: httpx.AsyncClient, prompt: list[int], key: str | None, session: int = -1, turn: int = 0
    ) -> Result:
        body = {"model": SLUG, "prompt": prompt, "max_tokens": OUTPUT_TOKENS, "temperature": 0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        headers = {"Authorization": f"Bearer {self.stack.key}"}
        if key is not None:
            headers[SESSION_HEADER] = key
        rec = Result(session, turn, sent=time.monotonic())
        done = False
        try:
            async with http.stream("POST", f"{self.stack.base}/v1/completions", json=body, headers=headers) as r:
                if r.status_code != 200:
                    rec.error = f"{r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                    return rec
                rec.replica = int(r.headers["x-switchyard-replica"])
                rec.reason = r.headers.get("x-switchyard-route-reason", "")
                predicted = r.headers.get("x-switchyard-cached-tokens-predicted")
                rec.predicted = int(predicted) if predicted is not None else None
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        done = True
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        rec.error = f"{chunk['error'].get('code')}: {chunk['error'].get('message', '')[:200]}"
                    elif chunk.get("choices") and rec.first is None:
                        rec.first = time.monotonic()
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                        rec.prompt_tokens, rec.tokens = usage["prompt_tokens"], usage["completion_tokens"]
                        rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        except (httpx.HTTPError, json.JSONDecodeError, KeyError, ValueError) as exc:
            rec.error = f"{type(exc).__name__}: {exc}"
        finally:
            rec.end = time.monotonic()
        if rec.error is None and (not done or rec.tokens != OUTPUT_TOKENS or rec.first is None):
            rec.error = f"incomplete stream: {rec.tokens} of {OUTPUT_TOKENS} tokens, [DONE] {done}"
        return rec

    async def replay(self, policy: str, restart: bool) -> tuple[list[Result], float, list[int], dict]:
        """One run of the trace under `policy`: its results, its wall time, the replicas and the
        gateway's routing-quality counters for the run."""
        self.runs += 1
        ids = await self.restart() if restart and self.runs > 1 else await self.wait_replicas(REPLICAS)
        # Each run its own alphabet (unless the replicas are new) and its own session keys (a
        # binding of an earlier run must not place this one's sessions).
        offset = 0 if restart else (self.runs - 1) * 7919 % (HIGH_TOKEN - LOW_TOKEN)
        header = policy in HEADER_POLICIES
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
        async with httpx.AsyncClient(timeout=httpx.Timeout(300, connect=30), limits=limits) as http:
            await self.warm_up(http)
            await self.set_routing(policy)
            before = await self.counters(http)
            results: list[Result] = []
            t0 = time.monotonic()

            async def run(s: Session) -> None:
                key = f"{policy}-{s.key}" if header else None
                children: list[asyncio.Task] = []
                for turn, think in enumerate(s.thinks):
                    await asyncio.sleep(think)
                    if turn == 0 and s.parent is None:
                        await asyncio.sleep(max(t0 + s.start - time.monotonic(), 0))
                    if turn == 0:  # sub-agents spawned before any answer arrives
                        children += [
                            asyncio.create_task(run(self.trace.sessions[c]))
                            for c in s.children
                            if self.trace.sessions[c].fork_turn == 0
                        ]
                    prompt = _relabel(s.prompt(turn), offset)
                    results.append(await self._request(http, prompt, key, s.index, turn))
                    children += [
                        asyncio.create_task(run(self.trace.sessions[c]))
                        for c in s.children
                        if self.trace.sessions[c].fork_turn == turn and turn > 0
                    ]
                await asyncio.gather(*children)

            await asyncio.gather(*(run(s) for s in self.trace.sessions if s.parent is None))
            wall = time.monotonic() - t0
            after = await self.counters(http)
            counters = {name: after.get(name, 0) - before.get(name, 0) for name in (REACHABLE, ROUTED)}
        return results, wall, ids, counters


def summarise(results: list[Result], wall: float, ids: list[int], ideal: float) -> dict:
    ok = [r for r in results if r.error is None]
    prompt = sum(r.prompt_tokens for r in ok)
    ttft = [(r.first - r.sent) * 1000 for r in ok if r.first is not None]
    per_replica = {rid: 0 for rid in ids}
    for r in ok:
        per_replica[r.replica] = per_replica.get(r.replica, 0) + 1
    counts = list(per_replica.values())
    mean = sum(counts) / len(counts) if counts else 0
    return {
        "hit_rate": round(sum(r.cached_tokens for r in ok) / prompt, 4) if prompt else 0.0,
        "ideal_hit_rate": round(ideal, 4),
        "ttft_p50_ms": round(percentile(ttft, 0.5), 1),
        "ttft_p90_ms": round(percentile(ttft, 0.9), 1),
        "tok_s": round(sum(r.tokens for r in ok) / wall, 1) if wall else 0.0,
        "imbalance": round(max(counts) / mean, 3) if mean else 0.0,
    }


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def report(summary: dict[str, dict], details: dict[str, dict], quiet: bool) -> None:
    """The human-readable comparison: each policy against round robin and against the targets."""
    base = summary.get("round_robin")
    for name, row in summary.items():
        d = details[name]
        line = (
            f"{name:17s} hit {row['hit_rate']:6.1%} of ideal {row['ideal_hit_rate']:.1%} "
            f"({_ratio(row['hit_rate'], row['ideal_hit_rate'])})  TTFT p50 {row['ttft_p50_ms']:7.1f} ms "
            f"p90 {row['ttft_p90_ms']:7.1f} ms  {row['tok_s']:6.1f} tok/s  "
            f"imbalance {row['imbalance']:.2f}"
        )
        if base is not None and name != "round_robin":
            line += (
                f"  | vs round_robin: TTFT p50 {_ratio(base['ttft_p50_ms'], row['ttft_p50_ms'])} lower, "
                f"p90 {_ratio(base['ttft_p90_ms'], row['ttft_p90_ms'])} lower, "
                f"hit {_ratio(row['hit_rate'], base['hit_rate'])}"
            )
        log(line, quiet)
        log(
            f"{'':17s} {d['requests']} requests ({d['errors']} failed), {d['wall_s']:.1f} s; per replica "
            f"{d['per_replica']}, distinct prompt blocks {d['blocks']} (capacity {d['capacity']}); reachable hit "
            f"(gateway) {d['reachable']}; predicted/actual cached {d['predicted_vs_actual']}; reasons {d['reasons']}",
            quiet,
        )
    if base is None:
        return
    for name, share in (("session", 0.9), ("kv_aware", 0.8)):
        row = summary.get(name)
        if row is None:
            continue
        of_ideal = row["hit_rate"] / row["ideal_hit_rate"] if row["ideal_hit_rate"] else 0.0
        speedup = base["ttft_p50_ms"] / row["ttft_p50_ms"] if row["ttft_p50_ms"] else 0.0
        log(
            f"target {name}: hit {of_ideal:.1%} of ideal (>= {share:.0%}: {'yes' if of_ideal >= share else 'NO'}), "
            f"imbalance {row['imbalance']:.2f} (<= 1.3: {'yes' if row['imbalance'] <= 1.3 else 'NO'}), "
            f"TTFT p50 {speedup:.2f}x lower than round_robin (>= 3x: {'yes' if speedup >= 3 else 'NO'})",
            quiet,
        )


def _details(results: list[Result], wall: float, ids: list[int], counters: dict, trace: Trace) -> dict:
    ok = [r for r in results if r.error is None]
    per_replica: dict[int, int] = {rid: 0 for rid in ids}
    blocks: dict[int, set[int]] = {rid: set() for rid in ids}
    reasons: dict[str, int] = {}
    for r in ok:
        per_replica[r.replica] = per_replica.get(r.replica, 0) + 1
        # Distinct prompt blocks a replica computed or reused (the trace's labels: a bijection of
        # the run's): more than its capacity, and it must have evicted some.
        blocks.setdefault(r.replica, set()).update(trace.block_hashes(r.session, r.turn, BLOCK_SIZE))
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    predicted = sum(r.predicted or 0 for r in ok)
    actual = sum(r.cached_tokens for r in ok)
    routed = counters.get(ROUTED, 0)
    errors = sorted({(r.error or "")[:100] for r in results if r.error})
    return {
        "requests": len(results),
        "errors": len(results) - len(ok),
        "error_kinds": errors[:3],
        "wall_s": wall,
        "per_replica": list(per_replica.values()),
        "blocks": [len(b) for b in blocks.values()],
        "reachable": f"{counters.get(REACHABLE, 0) / routed:.1%}" if routed else "n/a",
        "predicted_vs_actual": f"{predicted}/{actual}",
        "reasons": reasons,
    }


async def _main(args) -> dict:
    quiet = args.json
    policies = list(dict.fromkeys(p for p in args.policies.split(",") if p))
    unknown = set(policies) - set(POLICIES)
    if unknown:
        raise SystemExit(f"unknown policies: {', '.join(sorted(unknown))} (known: {', '.join(POLICIES)})")
    shape: Shape = QUICK if args.quick else Shape()
    trace = make_trace(args.seed, shape, args.sessions)
    ideal = trace.ideal_hit_rate(BLOCK_SIZE)
    log(
        f"trace (seed {args.seed}): {len(trace.sessions)} sessions "
        f"({sum(s.parent is not None for s in trace.sessions)} sub-agents), {trace.requests} requests, "
        f"{trace.prompt_tokens} prompt tokens, contexts up to {max(e for s in trace.sessions for e in s.ends)} "
        f"tokens; ideal hit rate {ideal:.1%}",
        quiet,
    )
    bench_model()  # before the stack: creating it takes torch and a few seconds
    log(
        f"starting make run on its own Redis; {REPLICAS} replicas x 1 thread, {KV_CACHE_BYTES >> 20} MiB KV each", quiet
    )
    t = time.monotonic()
    with environ(REPLICA_CPU_KV_BYTES=str(KV_CACHE_BYTES)):  # the node agent fills it into every CPU spec
        stack = Stack(quiet, hang_seconds=30.0)
    summary: dict[str, dict] = {}
    details: dict[str, dict] = {}
    try:
        bench = Bench(stack, trace, quiet)
        ids = await bench.setup()
        log(f"stack up, {SLUG} has replicas {ids} ({time.monotonic() - t:.0f} s)", quiet)
        for policy in policies:
            t = time.monotonic()
            results, wall, ids, counters = await bench.replay(policy, args.restart)
            summary[policy] = summarise(results, wall, ids, ideal)
            details[policy] = {**_details(results, wall, ids, counters, trace), "capacity": bench.kv_blocks}
            errors = details[policy]["error_kinds"]
            log(
                f"{policy}: done in {time.monotonic() - t:.0f} s ({wall:.0f} s replay)"
                + (f"; errors: {errors}" if errors else ""),
                quiet,
            )
    finally:
        stack.close(keep=args.keep)
        if args.keep:
            log(f"kept {stack.dir}", quiet)
    report(summary, details, quiet)
    return {"policies": summary}


def run(args) -> int:
    summary = asyncio.run(_main(args))
    print(json.dumps(summary))
    return 0
