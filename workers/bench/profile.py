"""`python -m workers.bench profile --out FILE`: the simulated engine's profile (workers/sim/
profile.py) for the real engine on this machine.

It times the real engine's steps (the demo model unless --model): prefill steps of one prompt
of several lengths, and decode steps of several batch sizes at two context lengths. It fits
`prefill = a + b·P` and `decode = c + d·B + e·C` by least squares (C: the context tokens the
batch holds), then replays one mixed workload (staggered arrivals, prompts and answers of mixed
lengths) on the real engine and on the simulated one with the fitted profile, side by side.
Last line: one JSON object {"profile": {...}, "fit": {"prefill_max_error", "decode_max_error"},
"replay": {"real_s", "sim_s", "ratio"}}.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path

from workers.demo import MODEL_DIR

PREFILL_TOKENS = (32, 64, 128, 192, 256, 384)
DECODE_BATCHES = (1, 2, 4, 8, 16)
DECODE_CONTEXTS = (64, 256)
DECODE_STEPS = 12


def _engine(model: str, threads: int):
    import torch

    from workers.engine.config import EngineConfig
    from workers.engine.llm_engine import LLMEngine

    torch.set_num_threads(threads)
    return LLMEngine(EngineConfig(model=model, device="cpu", dtype="float32", block_size=16, max_num_seqs=32,
                                  max_num_batched_tokens=2048, enable_prefix_caching=False))  # fmt: skip


def _prompt(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def _time_prefill(engine, rng, vocab: int, tokens: int, rounds: int) -> float:
    from workers.engine import SamplingParams

    times = []
    for r in range(rounds):
        engine.add_request(f"p{tokens}-{r}", _prompt(rng, vocab, tokens), SamplingParams(max_tokens=1, ignore_eos=True))
        started = time.perf_counter()
        engine.step()  # the whole prompt in one step (the budget holds it), and its first token
        times.append(time.perf_counter() - started)
        while engine.has_unfinished_requests():
            engine.step()
    return statistics.median(times)


def _time_decode(engine, rng, vocab: int, batch: int, context: int) -> float:
    from workers.engine import SamplingParams

    params = SamplingParams(max_tokens=DECODE_STEPS + 2, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"d{batch}-{context}-{i}", _prompt(rng, vocab, context), params)
    while any(seq.num_computed_tokens < seq.num_prompt_tokens for seq in engine.scheduler.running) or (
        engine.scheduler.waiting
    ):
        engine.step()
    times = []
    for _ in range(DECODE_STEPS):
        started = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - started)
    while engine.has_unfinished_requests():
        engine.step()
    return statistics.median(times)


def _fit(rows: list[tuple[list[float], float]]) -> tuple[list[float], float]:
    """Least squares of y on x (with the constant in x); the coefficients (each >= 0) and the
    largest relative residual."""
    import numpy as np

    x = np.array([r[0] for r in rows], dtype=float)
    y = np.array([r[1] for r in rows], dtype=float)
    coef = np.linalg.lstsq(x, y, rcond=None)[0].clip(min=0.0)
    error = float(np.max(np.abs(x @ coef - y) / y))
    return [float(c) for c in coef], error


def _replay(engine, rng, vocab: int, seed: int) -> float:
    """A mixed workload: 48 requests arriving every 2 steps, prompts 16-300 tokens, answers 4-40."""
    from workers.engine import SamplingParams

    trace_rng = random.Random(seed)
    trace = [(_prompt(trace_rng, vocab, trace_rng.randint(16, 300)), trace_rng.randint(4, 40)) for _ in range(48)]
    started, step = time.perf_counter(), 0
    while trace or engine.has_unfinished_requests():
        if trace and step % 2 == 0:
            prompt, answer = trace.pop(0)
            engine.add_request(f"r{step}", prompt, SamplingParams(max_tokens=answer, ignore_eos=True))
        engine.step()
        step += 1
    return time.perf_counter() - started


def run(args) -> int:
    from workers.sim.engine import SimConfig, SimEngine
    from workers.sim.profile import SimProfile

    model = str(args.model or MODEL_DIR)
    engine = _engine(model, args.threads)
    vocab = engine.model_config.vocab_size
    rng = random.Random(0)
    _time_prefill(engine, rng, vocab, 64, 2)  # warm-up
    prefill = [([1.0, n], _time_prefill(engine, rng, vocab, n, args.rounds)) for n in PREFILL_TOKENS]
    decode = []
    for context in DECODE_CONTEXTS:
        for batch in DECODE_BATCHES:
            seconds = _time_decode(engine, rng, vocab, batch, context)
            decode.append(([1.0, batch, batch * (context + DECODE_STEPS // 2)], seconds))
    (a, b), prefill_error = _fit(prefill)
    (c, d, e), decode_error = _fit(decode)
    kv = engine.executor.kv_description() if hasattr(engine.executor, "kv_description") else {}
    bytes_per_token = int(
        engine.executor.kv_cache.numel()
        * engine.executor.kv_cache.element_size()
        // (engine.block_manager.num_blocks * engine.config.block_size)
    )
    profile = SimProfile(
        prefill_base=round(a, 6),
        prefill_per_token=round(b, 9),
        decode_base=round(c, 6),
        decode_per_seq=round(d, 9),
        decode_per_context_token=round(e, 11),
        kv_bytes_per_token=bytes_per_token,
        source=f"python -m workers.bench profile: {Path(model).parent.name}/{Path(model).name}, cpu, float32, "
        f"{args.threads} thread(s), {time.strftime('%Y-%m-%d')}",
    )
    kv_bytes = engine.block_manager.num_blocks * 16 * bytes_per_token
    sim_engine = SimEngine(SimConfig(model=model, profile=profile, block_size=16, max_num_seqs=32,
                                     max_num_batched_tokens=2048, enable_prefix_caching=False,
                                     kv_cache_bytes=kv_bytes))  # fmt: skip
    # Side by side, alternating, the median of each: the machine's speed drifts within a run.
    real_runs, sim_runs = [], []
    for round_ in range(args.rounds):
        real_runs.append(_replay(engine, rng, vocab, seed=7 + round_))
        sim_runs.append(_replay(sim_engine, rng, vocab, seed=7 + round_))
    real, sim = statistics.median(real_runs), statistics.median(sim_runs)
    if args.out:
        Path(args.out).write_text(json.dumps(profile.to_dict(), indent=2) + "\n")
    result = {
        "profile": profile.to_dict(),
        "fit": {"prefill_max_error": round(prefill_error, 3), "decode_max_error": round(decode_error, 3)},
        "replay": {"real_s": round(real, 3), "sim_s": round(sim, 3), "ratio": round(sim / real, 3)},
    }
    if not args.json:
        print(f"layout: {kv}")
        print("prefill tokens -> measured ms / fitted ms")
        for x, y in prefill:
            print(f"  {int(x[1]):5d}  {y * 1000:7.2f} / {profile.step_seconds(int(x[1]), 0, 0) * 1000:7.2f}")
        print("decode batch x context -> measured ms / fitted ms")
        for x, y in decode:
            fitted = profile.step_seconds(0, int(x[1]), int(x[2])) * 1000
            print(f"  {int(x[1]):3d} x {int(x[2] / x[1]):4d}  {y * 1000:7.2f} / {fitted:7.2f}")
        print(f"replay of a mixed workload: real {real:.2f} s, simulated {sim:.2f} s ({sim / real:.2f}x)")
        if args.out:
            print(f"profile written to {args.out}")
    print(json.dumps(result))
    return 0
