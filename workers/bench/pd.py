"""Prefill/decode disaggregation benchmark: the same arrival trace on the same cores, served by
(a) two colocated replicas, one core each, and (b) one prefill and one decode replica, one
core each (KV blocks over Mooncake TCP).

The trace is seeded Poisson arrivals mixing long prompts (1-2k tokens, few output tokens) with
decode-heavy requests (short prompts, 128-256 output tokens). Replicas are driven through Redis
exactly as the gateway drives them (the web process is left out: it is the same in both setups).
Greedy decoding, so both setups must produce the same tokens. The last line is one JSON object.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from workers.bench.processes import ROOT, percentile, start_replica, stop

REDIS_DB = 11
SHAPE = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=4096,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
)


@dataclass
class Request:
    arrival: float  # seconds after the start
    prompt: list[int]
    max_tokens: int
    kind: str
    sent_at: float = 0.0
    stamps: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    replica: int = 0
    fallback: str | None = None


def make_trace(n: int, rate: float, long_fraction: float, seed: int) -> list[tuple[float, list[int], int, str]]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        if rng.random() < long_fraction:
            prompt = [rng.randrange(10, SHAPE["vocab_size"]) for _ in range(rng.randint(1024, 2048))]
            out.append((t, prompt, rng.randint(8, 16), "long"))
        else:
            prompt = [rng.randrange(10, SHAPE["vocab_size"]) for _ in range(rng.randint(32, 96))]
            out.append((t, prompt, rng.randint(128, 256), "decode"))
    return out


class Setup:
    """Replica processes pinned to cores, plus a listener for their events."""

    def __init__(
        self,
        model: str,
        roles: list[tuple[int, str, int]],
        redis_url: str,
        workdir: Path,
        local_prefill_tokens: int,
        chunk: int,
    ):
        import redis

        from workers.protocol import replica as protocol
        from workers.protocol.replica import ReplicaSpec

        self.redis = redis.Redis.from_url(redis_url, decode_responses=True)
        self.protocol = protocol
        self.procs, self.logs = [], []
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        for rid, role, core in roles:
            self.redis.delete(protocol.status_key(rid), protocol.requests_key(rid))
            spec = ReplicaSpec(replica_id=rid, deployment="bench-pd", model_dir=model, model_name="bench-pd", role=role,
                               dtype="float32", threads=1, redis_url=redis_url, kv_cache_bytes=256 << 20,
                               max_num_seqs=64, kv_transfer_timeout=5.0,
                               local_prefill_tokens=local_prefill_tokens,
                               max_num_batched_tokens=chunk)  # fmt: skip
            process, log = start_replica(spec, workdir, env, core)
            self.procs.append(process)
            self.logs.append(log)
        deadline = time.monotonic() + 180
        for rid, _, _ in roles:
            while self.redis.hget(protocol.status_key(rid), "state") != "ready":
                if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                    raise SystemExit(f"replica {rid} did not start; see {workdir}")
                time.sleep(0.2)
        self.channel = f"bench-pd-{uuid.uuid4().hex[:8]}"
        self.requests: dict[str, Request] = {}
        self.pubsub = self.redis.pubsub()
        self.pubsub.subscribe(self.channel)
        self.pubsub.get_message(timeout=1)
        self.listener = threading.Thread(target=self._listen, daemon=True)
        self.listener.start()

    def _listen(self) -> None:
        for message in self.pubsub.listen():
            if message["type"] != "message":
                continue
            now = time.monotonic()
            event = self.protocol.read_event(json.loads(message["data"]))
            req = self.requests.get(event.id)
            if req is None:
                continue
            if isinstance(event, self.protocol.DeltaEvent):
                req.stamps.append(now)
                req.tokens += event.token_ids
                if event.final:
                    req.fallback = (event.disaggregation or {}).get("fallback")
                    req.done.set()
            elif isinstance(event, self.protocol.ErrorEvent):
                print(f"request failed: {event}", file=sys.stderr)
                req.done.set()

    def send(self, rid: str, req: Request, replica: int, prefill: int | None) -> None:
        params = self.protocol.WireSamplingParams(temperature=0.0, max_tokens=req.max_tokens, ignore_eos=True)
        message = self.protocol.GenerateMessage(
            rid, self.channel, params, prompt_token_ids=req.prompt, prefill_replica=prefill
        )
        req.replica = replica
        self.requests[rid] = req
        req.sent_at = time.monotonic()
        self.redis.xadd(self.protocol.requests_key(replica), {"m": self.protocol.encode(message.to_wire())})

    def kv_stats(self, rid: int) -> dict:
        status = self.protocol.ReplicaStatus.from_hash(self.redis.hgetall(self.protocol.status_key(rid)))
        return status.load.get("kv_transfer", {})

    def close(self) -> None:
        stop(self.procs, self.logs, timeout=10)


def replay(setup: Setup, trace, route) -> tuple[list[Request], float]:
    """Send each request at its arrival time; `route(req, inflight)` -> (replica, prefill)."""
    reqs = [Request(t, p, m, k) for t, p, m, k in trace]
    inflight: dict[int, int] = {}
    start = time.monotonic()
    for i, req in enumerate(reqs):
        delay = start + req.arrival - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        for r in reqs[:i]:
            if r.done.is_set() and r.replica in inflight and not getattr(r, "_counted", False):
                inflight[r.replica] -= 1
                r._counted = True
        replica, prefill = route(req, inflight)
        inflight[replica] = inflight.get(replica, 0) + 1
        setup.send(f"r{i}-{uuid.uuid4().hex[:6]}", req, replica, prefill)
    for req in reqs:
        if not req.done.wait(300):
            raise SystemExit("a request did not finish in 300 s")
    return reqs, time.monotonic() - start


def summarize(reqs: list[Request], elapsed: float) -> dict:
    ttft = [(r.stamps[0] - r.sent_at) * 1000 for r in reqs if r.stamps]
    itl = [(b - a) * 1000 for r in reqs for a, b in zip(r.stamps, r.stamps[1:], strict=False)]
    out_tokens = sum(len(r.tokens) for r in reqs)
    return {
        "ttft_p50_ms": round(statistics.median(ttft), 1),
        "ttft_p90_ms": round(percentile(ttft, 0.9), 1),
        "itl_p50_ms": round(statistics.median(itl), 2),
        "itl_p90_ms": round(percentile(itl, 0.9), 2),
        "itl_p99_ms": round(percentile(itl, 0.99), 2),
        "tok_s": round(out_tokens / elapsed, 1),
        "fallbacks": sum(1 for r in reqs if r.fallback),
    }


def run(args) -> int:
    import redis

    from workers.bench.checkpoints import random_checkpoint

    quiet = args.json
    say = (lambda *_: None) if quiet else (lambda m: print(m, flush=True))
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("this benchmark pins two replicas to two cores; this machine has fewer")
    cores = sorted(os.sched_getaffinity(0))[:2]
    model = str(args.model or random_checkpoint("pd-bench", SHAPE, seed=1))
    redis_url = f"redis://127.0.0.1:6379/{REDIS_DB}"
    redis.Redis.from_url(redis_url).flushdb()
    trace = make_trace(args.requests, args.rate, args.long_fraction, args.seed)
    longs = sum(1 for t in trace if t[3] == "long")
    say(f"model {model}; trace: {len(trace)} requests over {trace[-1][0]:.1f} s ({longs} long prompts), cores {cores}")
    workdir = Path(tempfile.mkdtemp(prefix="sy-bench-pd-"))
    results = {}
    try:
        say("(a) colocated: two replicas, one core each")
        roles = [(9201, "colocated", cores[0]), (9202, "colocated", cores[1])]
        colo = Setup(model, roles, redis_url, workdir, 0, args.chunk)
        try:
            least = lambda req, inflight: (min((9201, 9202), key=lambda r: inflight.get(r, 0)), None)  # noqa: E731
            colo_reqs, colo_time = replay(colo, trace, least)
        finally:
            colo.close()
        results["colocated"] = summarize(colo_reqs, colo_time)
        say(f"    {results['colocated']}")
        say("(b) disaggregated: prefill on one core, decode on the other")
        dis = Setup(
            model,
            [(9203, "prefill", cores[0]), (9204, "decode", cores[1])],
            redis_url,
            workdir,
            args.local_prefill_tokens,
            args.chunk,
        )
        try:
            dis_reqs, dis_time = replay(dis, trace, lambda req, inflight: (9204, 9203))
            time.sleep(1.0)  # one heartbeat, so the transfer counters are current
            kv = dis.kv_stats(9203)
        finally:
            dis.close()
        results["disaggregated"] = summarize(dis_reqs, dis_time)
        say(f"    {results['disaggregated']}")
    finally:
        redis.Redis.from_url(redis_url).flushdb()
        shutil.rmtree(workdir, ignore_errors=True)
    c, d = results["colocated"], results["disaggregated"]
    gib_s = kv.get("bytes_sent", 0) / max(kv.get("transfer_seconds", 0), 1e-9) / (1 << 30)
    identical = all(a.tokens == b.tokens for a, b in zip(colo_reqs, dis_reqs, strict=True))
    say(
        f"KV moved: {kv.get('bytes_sent', 0) / (1 << 20):.1f} MiB in {kv.get('blocks_sent', 0)} blocks at "
        f"{gib_s:.2f} GiB/s; greedy outputs identical: {identical}"
    )
    say(
        f"p90 ITL {c['itl_p90_ms']} -> {d['itl_p90_ms']} ms ({c['itl_p90_ms'] / d['itl_p90_ms']:.2f}x lower, "
        f"target >= 3x); TTFT p50 {c['ttft_p50_ms']} -> {d['ttft_p50_ms']} ms "
        f"({d['ttft_p50_ms'] / c['ttft_p50_ms']:.2f}x, target <= 1.5x); "
        f"tok/s {c['tok_s']} -> {d['tok_s']}"
    )
    print(
        json.dumps(
            {
                "itl_p90_colocated_ms": c["itl_p90_ms"],
                "itl_p90_disagg_ms": d["itl_p90_ms"],
                "ttft_p50_colocated_ms": c["ttft_p50_ms"],
                "ttft_p50_disagg_ms": d["ttft_p50_ms"],
                "tok_s_colocated": c["tok_s"],
                "tok_s_disagg": d["tok_s"],
                "outputs_identical": identical,
                "transfer_gib_s": round(gib_s, 3),
                "colocated": c,
                "disaggregated": d,
            }
        )
    )
    return 0
