"""KV tiers benchmark: what host DRAM, the Mooncake Store and disk add to the device cache.

Two engine replicas, each in its own process on one core with one torch thread, replay a seeded
agent trace (agent_trace.py, a smaller shape than the cache benchmark's: `SHAPE`). The benchmark
routes like the gateway's `session` policy: a session's requests go to one replica, chosen by
rendezvous hashing of its key over the replicas up now, and carry `session_turn`. Each replica
has a finite device cache (`KV_CACHE_BYTES`, the contexts of a few sessions), so it evicts.

Runs, each on fresh processes, a fresh `mooncake_master` and a fresh disk directory:
- `device`: the device cache alone;
- `dram`: + a host-DRAM tier per replica (`DRAM_BYTES`, smaller than the trace's working set);
- `store`: + the Mooncake Store shared by the replicas;
- `disk`: + a disk tier (the node's directory, shared by both replicas);
- `scale_out`: as `store`, and a third replica joins once a sixth of the requests are answered
  (the sessions rendezvous hashing gives it move there; its process starts with the others, so
  it joins with a cold cache but without waiting for its model to load);
- `restart`: as `store`, and replica 1 restarts once a sixth of the requests are answered (its
  sessions go to replica 0 while it is down, and come back);
- `scale_out_device`, `restart_device`: the same two events without tiers (the baseline).

Per run: input-token hit rate (cached / prompt tokens) and its split by where the tokens came
from, the trace's ideal hit rate (infinite cache, perfect routing), TTFT p50/p90, output tok/s,
bytes the tiers moved, and `first20_hit_rate`: the hit rate of the first 20 requests of the
replica that joined (scale_out) or restarted (restart), or of replica 1 from the start (other
runs). Target: ≥ 70% of the ideal for the joining and the restarted replica.

Then TTFT for a 2k-token prompt recomputed, loaded from DRAM and loaded from the store (median
of three prompts each), and the store-vs-recompute crossover by prefix length. The last line is
one JSON object: {"runs": {run: {"hit_rate", "hit_rate_by_tier", "ideal_hit_rate",
"ttft_p50_ms", "ttft_p90_ms", "tok_s", "first20_hit_rate"}}, "ttft_2k_recompute_ms",
"ttft_2k_dram_ms", "ttft_2k_store_ms"}.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path

from workers.bench.agent_trace import Shape, Trace, make_trace
from workers.bench.cache import bench_model
from workers.bench.processes import percentile

RUNS = ("device", "dram", "store", "disk", "scale_out", "restart")
# The same events with the device cache alone: the baseline of the scale-out and restart targets
# (printed, not in the JSON line).
BASELINES = ("scale_out_device", "restart_device")
BLOCK_SIZE = 16
OUTPUT_TOKENS = 8
# This model's KV is 4 KiB a token (cache.py): 32 MiB is 8k tokens, the contexts of about four
# sessions, while each replica serves about eight.
KV_CACHE_BYTES = 32 << 20
DRAM_BYTES = 64 << 20  # twice the device cache: still less than a replica's sessions need
DISK_BYTES = 1 << 30
STORE_POOL_BYTES = 1 << 30  # the store's pool (one segment server): it holds the whole trace
SHAPE = Shape(
    sessions=16,
    context_tokens=(400, 1200),
    turns=(6, 12),
    sub_turns=(4, 8),
    max_context=3072,
    think_median=0.6,
    think_range=(0.1, 2.0),
    arrival_seconds=12.0,
)
FIRST = 20  # requests of a joining or restarted replica counted by first20_hit_rate


def log(message: str, quiet: bool) -> None:
    if not quiet:
        print(message, flush=True)


# -- a replica: an engine in its own process ------------------------------------------------------
def replica_main(conn: Connection, model: str, tiers: dict | None, kv_bytes: int, core: int | None) -> None:
    """Serve ("gen", id, prompt, session_turn, max_tokens) until ("stop",); answer ("first", id)
    at the first token and ("done", id, prompt, cached, by_tier, tokens) at the end."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    import torch

    from workers.engine import SamplingParams
    from workers.engine.config import EngineConfig
    from workers.engine.llm_engine import LLMEngine

    torch.set_num_threads(1)
    engine = LLMEngine(
        EngineConfig(
            model=model, kv_cache_bytes=kv_bytes, block_size=BLOCK_SIZE, max_num_batched_tokens=1024, kv_tiers=tiers
        )
    )
    conn.send(("ready",))
    seqs, started = {}, set()
    while True:
        if not engine.has_unfinished_requests():
            conn.poll(None)
        while conn.poll(0):
            msg = conn.recv()
            if msg[0] == "gen":
                _, rid, prompt, turn, max_tokens = msg
                params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
                seqs[rid] = engine.add_request(rid, prompt, params, session_turn=turn)
            elif msg[0] == "flush":
                conn.send(("flushed", engine.tiers.flush(30) if engine.tiers else True))
            elif msg[0] == "stats":
                conn.send(("stats", engine.tier_stats()))
            elif msg[0] == "stop":
                stats = engine.tier_stats()
                engine.close()
                conn.send(("stopped", stats))
                return
        for delta in engine.step():
            rid = delta.request_id
            if rid not in started:
                started.add(rid)
                conn.send(("first", rid))
            if delta.finished:
                seq = seqs.pop(rid)
                started.discard(rid)
                conn.send(
                    ("done", rid, seq.num_prompt_tokens, seq.num_cached_tokens, dict(seq.tier_cached_tokens),
                     seq.num_output_tokens)
                )  # fmt: skip


class Replica:
    def __init__(self, slot: int, model: str, tiers: dict | None, kv_bytes: int = KV_CACHE_BYTES):
        self.slot = slot
        self.conn, child = mp.get_context("spawn").Pipe()
        cores = os.sched_getaffinity(0)
        core = sorted(cores)[slot % len(cores)]
        self.proc = mp.get_context("spawn").Process(
            target=replica_main, args=(child, model, tiers, kv_bytes, core), daemon=True
        )
        self.proc.start()
        self.ready = False
        self.served = 0  # requests answered
        self.inflight = 0
        self.stats: dict | None = None

    def send(self, *msg) -> None:
        self.conn.send(msg)

    def call(self, *msg, timeout: float = 60.0):
        """A request whose answer this replica sends next (it is idle: nothing else in flight)."""
        self.conn.send(msg)
        if not self.conn.poll(timeout):
            raise TimeoutError(f"replica {self.slot} did not answer {msg[0]!r} in {timeout} s")
        return self.conn.recv()

    def wait_ready(self, timeout: float = 120.0) -> None:
        if not self.conn.poll(timeout):
            raise TimeoutError(f"replica {self.slot} did not start in {timeout} s")
        assert self.conn.recv() == ("ready",)
        self.ready = True

    def stop(self) -> dict | None:
        if self.proc.is_alive():
            reply = self.call("stop")
            self.stats = reply[1]
        self.proc.join(10)
        return self.stats


# -- the store's master and the run's tiers -------------------------------------------------------
class Tiers:
    """A run's tier settings, with its own master and disk directory."""

    def __init__(self, run: str, workdir: Path):
        self.master = self.pool = None
        self.config: dict | None = None
        if run == "device":
            return
        self.config = {"dram_bytes": DRAM_BYTES}
        if run != "dram":
            self.master, self.pool, address = start_store()
            self.config.update(store_master=address, store_segment_bytes=0)
        if run == "disk":
            path = workdir / "disk"
            shutil.rmtree(path, ignore_errors=True)
            self.config.update(disk_path=str(path), disk_bytes=DISK_BYTES)

    def close(self) -> None:
        if self.master is not None:
            stop_store(self.master, self.pool)


def start_store():
    """A master and one segment server holding the whole pool (as `make run` starts them):
    replicas contribute no memory, so a block outlives the replica that put it."""
    from workers.kvtiers.master import free_port, start_master, start_segment_server

    port = free_port()
    master = start_master(port, free_port())
    pool = start_segment_server(f"127.0.0.1:{port}", STORE_POOL_BYTES, free_port())
    return master, pool, f"127.0.0.1:{port}"


def stop_store(master, pool) -> None:
    from workers.kvtiers.master import stop_master

    stop_master(pool)
    stop_master(master)


# -- replaying the trace ------------------------------------------------------------------------
@dataclass
class Request:
    session: int
    turn: int
    replica: int
    sent: float
    first: float | None = None
    end: float | None = None
    prompt: int = 0
    cached: int = 0
    by_tier: dict = field(default_factory=dict)
    tokens: int = 0
    ordinal: int = 0  # its place among the requests its replica incarnation served


def rendezvous(key: str, slots: list[int]) -> int:
    return max(slots, key=lambda s: hashlib.blake2b(f"{key}/{s}".encode(), digest_size=8).digest())


class Replay:
    """One run: the trace through the replicas, a session's turns in order, think times between."""

    def __init__(self, trace: Trace, model: str, tiers: dict | None, run: str, quiet: bool):
        self.trace, self.model, self.tiers, self.run, self.quiet = trace, model, tiers, run, quiet
        # The joining replica's process starts with the others (loading takes seconds) and joins
        # the routing at the event: its cache is as cold as a new replica's.
        slots = (0, 1, 2) if run == "scale_out" else (0, 1)
        self.replicas = {slot: Replica(slot, model, tiers) for slot in slots}
        for r in self.replicas.values():
            r.wait_ready()
        if run == "scale_out":
            self.replicas[2].ready = False
        self.requests: dict[str, Request] = {}
        self.watch: int | None = 1 if run not in ("scale_out", "restart") else None  # first20's replica
        self.watch_from = 0.0
        self.event = {"scale_out": "join", "restart": "restart"}.get(run)
        self.draining: Replica | None = None
        self.stats: list[dict] = []
        self.due: list[tuple[float, int, int]] = []  # (time, session, turn)
        self.children: dict[tuple[int, int], list[int]] = {}
        self.answered = 0

    def up(self) -> list[int]:
        return [s for s, r in self.replicas.items() if r.ready]

    def _send(self, si: int, turn: int, now: float) -> None:
        s = self.trace.sessions[si]
        slot = rendezvous(s.key, self.up())
        replica = self.replicas[slot]
        rid = f"{si}-{turn}"
        replica.inflight += 1
        self.requests[rid] = Request(si, turn, slot, now)
        replica.send("gen", rid, s.prompt(turn), True, OUTPUT_TOKENS)
        if turn == 0:  # sub-agents spawned before any answer start now
            self._spawn(si, 0, now)

    def _spawn(self, si: int, turn: int, at: float) -> None:
        for child in self.children.get((si, turn), []):
            heapq.heappush(self.due, (at + self.trace.sessions[child].thinks[0], child, 0))

    def _answered(self, rid: str, at: float) -> None:
        self.answered += 1
        req = self.requests[rid]
        s = self.trace.sessions[req.session]
        if req.turn + 1 < len(s.ends):
            heapq.heappush(self.due, (at + s.thinks[req.turn + 1], req.session, req.turn + 1))
        if req.turn > 0:
            self._spawn(req.session, req.turn, at)

    def _event(self) -> None:
        """Once a sixth of the requests are answered: a third replica joins (its process was
        started with the others), or replica 1 stops taking turns, drains and restarts. Neither
        blocks the replay: a restarted process becomes routable when it reports ready
        (`_receive`)."""
        if self.event == "join":
            log("  a third replica joins", self.quiet)
            self.replicas[2].ready = True
            self.watch, self.watch_from = 2, time.monotonic()
            self.event = None
        elif self.draining is None:
            log("  replica 1 restarts", self.quiet)
            self.draining = self.replicas[1]
            self.draining.ready = False  # new turns go elsewhere while it drains
        elif self.draining.inflight == 0:
            self.stats.append(self.draining.stop() or {})
            self.replicas[1] = Replica(1, self.model, self.tiers)
            self.watch = 1
            self.event = None

    def _receive(self, timeout: float) -> None:
        conns = {r.conn: r for r in self.replicas.values() if r.proc.is_alive()}
        for conn in wait(list(conns), timeout=timeout):
            replica = conns[conn]
            while conn.poll(0):
                msg = conn.recv()
                now = time.monotonic()
                if msg[0] == "ready":
                    replica.ready = True
                    self.watch_from = now
                elif msg[0] == "first":
                    self.requests[msg[1]].first = now
                elif msg[0] == "done":
                    req = self.requests[msg[1]]
                    _, _, req.prompt, req.cached, req.by_tier, req.tokens = msg
                    req.end = now
                    replica.inflight -= 1
                    replica.served += 1
                    req.ordinal = replica.served
                    self._answered(msg[1], now)

    def play(self) -> float:
        """Replay the trace; returns the wall time."""
        trace = self.trace
        started = time.monotonic()
        for s in trace.sessions:
            if s.parent is None:
                heapq.heappush(self.due, (started + s.start + s.thinks[0], s.index, 0))
            else:
                self.children.setdefault((s.parent, s.fork_turn), []).append(s.index)
        while self.answered < trace.requests:
            now = time.monotonic()
            while self.due and self.due[0][0] <= now:
                _, si, turn = heapq.heappop(self.due)
                self._send(si, turn, now)
            timeout = max(self.due[0][0] - now, 0.0) if self.due else 0.5
            self._receive(min(timeout, 0.5))
            if self.event and self.answered >= trace.requests // 6:
                self._event()
        wall = time.monotonic() - started
        for r in self.replicas.values():
            self.stats.append(r.stop() or {})
        return wall

    def summary(self, wall: float, ideal: float) -> dict:
        reqs = list(self.requests.values())
        prompt = sum(r.prompt for r in reqs)
        cached = sum(r.cached for r in reqs)
        by_tier = {t: sum(r.by_tier.get(t, 0) for r in reqs) for t in ("dram", "store", "disk")}
        by_tier = {"device": cached - sum(by_tier.values()), **by_tier}
        watched = sorted(
            (r for r in reqs if r.replica == self.watch and r.sent >= self.watch_from), key=lambda r: r.sent
        )[:FIRST]
        ttft = [1000 * (r.first - r.sent) for r in reqs]
        moved = sum(
            t.get("bytes_read", 0) + t.get("bytes_written", 0)
            for s in self.stats
            for t in (s or {}).get("tiers", {}).values()
        )
        return {
            "hit_rate": cached / prompt,
            "hit_rate_by_tier": {t: n / prompt for t, n in by_tier.items()},
            "ideal_hit_rate": ideal,
            "ttft_p50_ms": percentile(ttft, 0.5),
            "ttft_p90_ms": percentile(ttft, 0.9),
            "tok_s": sum(r.tokens for r in reqs) / wall,
            "first20_hit_rate": sum(r.cached for r in watched) / max(sum(r.prompt for r in watched), 1),
            "_bytes_moved": moved,
            "_first20_n": len(watched),
        }


# -- 2k-token TTFT: recomputed, from DRAM, from the store; and the crossover ---------------------
def prompt_of(n: int, seed: int) -> list[int]:
    return [16 + (seed * 7919 + i * 104729) % 984 for i in range(n)]


def ttft(replica: Replica, rid: str, prompt: list[int], turn: bool = False) -> float:
    """Milliseconds to the first token of `prompt` on an idle replica (one token generated)."""
    t0 = time.monotonic()
    replica.send("gen", rid, prompt, turn, 1)
    while True:
        msg = replica.conn.recv()
        if msg[0] == "first":
            first = time.monotonic()
        if msg[0] == "done":
            return 1000 * (first - t0), msg[3], msg[4]


def single_prompt(model: str, workdir: Path, quiet: bool) -> dict:
    master, pool, address = start_store()
    store = {"store_master": address, "store_segment_bytes": 0}
    # A: recomputes, then keeps the prompts in DRAM and puts them in the store. Its device cache
    # holds one 2k prompt: the next prompt evicts the previous one (to DRAM).
    a = Replica(0, model, {"dram_bytes": DRAM_BYTES, **store}, kv_bytes=9 << 20)
    b = Replica(1, model, store, kv_bytes=9 << 20)  # B: a replica with only the store behind it
    a.wait_ready()
    b.wait_ready()
    for r in (a, b):  # the store client connects in the background
        deadline = time.monotonic() + 30
        while not r.call("stats")[1]["tiers"]["store"]["available"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica {r.slot} never connected to the store")
            time.sleep(0.1)
    out = {"recompute": [], "dram": [], "store": []}
    prompts = [prompt_of(2048, k) for k in range(4)]
    for k, p in enumerate(prompts):
        ms, cached, _ = ttft(a, f"r{k}", p, turn=True)
        assert cached == 0, "a fresh prompt hit a cache"
        out["recompute"].append(ms)
    assert a.call("flush")[1], "the store writes did not finish"
    for k, p in enumerate(prompts[:3]):  # each one was evicted to DRAM by the next
        ms, cached, by_tier = ttft(a, f"d{k}", p)
        assert by_tier.get("dram", 0) >= 2000, f"prompt {k} did not come from DRAM: {by_tier}"
        out["dram"].append(ms)
    for k, p in enumerate(prompts[:3]):
        ms, cached, by_tier = ttft(b, f"s{k}", p)
        assert by_tier.get("store", 0) >= 2000, f"prompt {k} did not come from the store: {by_tier}"
        out["store"].append(ms)
    # The crossover: a prefix of n tokens loaded from the store vs recomputed (16 tokens on top).
    crossover = []
    for n in (32, 128, 512, 1024):
        p = prompt_of(n + 16, 100 + n)
        recompute, _, _ = ttft(a, f"x{n}", p, turn=True)
        a.call("flush")
        loaded, _, by_tier = ttft(b, f"y{n}", p)
        crossover.append(
            {"prefix_tokens": n, "recompute_ms": recompute, "store_ms": loaded, "from_store": by_tier.get("store", 0)}
        )
    a.stop()
    b.stop()
    stop_store(master, pool)
    med = {k: statistics.median(v) for k, v in out.items()}
    log(
        f"2k-token prompt TTFT (median of 3): recomputed {med['recompute']:.0f} ms, from DRAM {med['dram']:.0f} ms "
        f"({med['recompute'] / med['dram']:.1f}x faster), from the store {med['store']:.0f} ms "
        f"({med['recompute'] / med['store']:.1f}x faster)",
        quiet,
    )
    for c in crossover:
        log(
            f"  prefix {c['prefix_tokens']:>5} tokens: recomputed {c['recompute_ms']:.1f} ms, from the store "
            f"{c['store_ms']:.1f} ms ({c['from_store']} tokens loaded)",
            quiet,
        )
    return {"median": med, "crossover": crossover}


def run(args) -> int:
    quiet = args.json
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = sorted(set(runs) - set(RUNS) - set(BASELINES))
    if unknown:
        print(f"unknown runs {unknown}; choose from {', '.join(RUNS + BASELINES)}")
        return 2
    model = str(bench_model())
    trace = make_trace(args.seed, SHAPE, args.sessions)
    ideal = trace.ideal_hit_rate(BLOCK_SIZE)
    log(
        f"trace: {len(trace.sessions)} sessions, {trace.requests} requests, {trace.prompt_tokens} prompt tokens, "
        f"ideal hit rate {ideal:.1%}; 2 replicas, {KV_CACHE_BYTES >> 20} MiB device cache each",
        quiet,
    )
    workdir = Path(tempfile.mkdtemp(prefix="sy-tiers-"))
    results = {}
    try:
        for name in runs:
            event = name.removesuffix("_device")
            kind = "device" if name.endswith("_device") else "store" if event in ("scale_out", "restart") else name
            tiers = Tiers(kind, workdir)
            try:
                replay = Replay(trace, model, tiers.config, event, quiet)
                wall = replay.play()
            finally:
                tiers.close()
            results[name] = replay.summary(wall, ideal)
            r = results[name]
            split = ", ".join(f"{t} {v:.1%}" for t, v in r["hit_rate_by_tier"].items())
            log(
                f"{name:>9}: hit rate {r['hit_rate']:.1%} ({r['hit_rate'] / ideal:.0%} of ideal; {split}); "
                f"TTFT p50 {r['ttft_p50_ms']:.0f} ms, p90 {r['ttft_p90_ms']:.0f} ms; {r['tok_s']:.1f} tok/s; "
                f"first {r['_first20_n']} of the watched replica {r['first20_hit_rate']:.1%} "
                f"({r['first20_hit_rate'] / ideal:.0%} of ideal); tiers moved {r['_bytes_moved'] / 2**20:.0f} MiB",
                quiet,
            )
        single = single_prompt(model, workdir, quiet)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if "device" in results:
        for name, r in results.items():
            if name != "device":
                log(
                    f"{name} vs device: TTFT p90 {results['device']['ttft_p90_ms'] / r['ttft_p90_ms']:.2f}x lower, "
                    f"tok/s {r['tok_s'] / results['device']['tok_s']:.2f}x",
                    quiet,
                )
    out = {
        "runs": {
            name: {k: v for k, v in r.items() if not k.startswith("_")} for name, r in results.items() if name in RUNS
        },
        "ttft_2k_recompute_ms": single["median"]["recompute"],
        "ttft_2k_dram_ms": single["median"]["dram"],
        "ttft_2k_store_ms": single["median"]["store"],
    }
    print(json.dumps(out))
    return 0
