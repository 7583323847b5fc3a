"""`python -m workers.bench samples`: n samples of one prompt (forked from its shared KV
blocks, workers/engine/parallel_sampling.py) against n independent requests of that prompt.

Both sides run on the same engine settings, side by side; sample i is seeded seed + i and the
independent request i is seeded seed + i, so both produce the same tokens (checked). Reported:
tokens the model computed (prompt and decode), the peak of KV blocks in use, and wall time.
The independent requests run with the prefix cache (later ones reuse blocks the first ones
computed when the step budget spreads their prefill over steps) and without it.
Last line: one JSON object {"n", "prompt_tokens", "forked", "independent",
"independent_no_prefix_cache", "ratios" (independent / forked), "same_outputs"}.
"""

from __future__ import annotations

import json
import random
import time

from workers.demo import MODEL_DIR


def _measure(engine, add) -> dict:
    counts, execute = [], engine.runner.execute

    def counting(batch, *args, **kwargs):
        counts.append(sum(item.num_tokens for item in batch.all))
        return execute(batch, *args, **kwargs)

    engine.runner.execute = counting
    bm = engine.block_manager
    bm.reset_prefix_cache()
    outputs: dict = {}
    peak = 0
    started = time.perf_counter()
    add()
    while engine.has_unfinished_requests():
        for d in engine.step():
            outputs.setdefault((d.request_id, d.index), []).extend(d.new_token_ids)
        peak = max(peak, bm.num_blocks - bm.num_free_blocks)
    wall = time.perf_counter() - started
    engine.runner.execute = execute
    return {
        "tokens_computed": sum(counts),
        "peak_blocks": peak,
        "wall_s": round(wall, 3),
        "outputs": [outputs[k] for k in sorted(outputs)],
    }


def run(args) -> int:
    import torch

    from workers.engine import SamplingParams
    from workers.engine.config import EngineConfig
    from workers.engine.llm_engine import LLMEngine

    torch.set_num_threads(args.threads)
    engine = LLMEngine(EngineConfig(model=str(args.model or MODEL_DIR), device=args.device, dtype="float32",
                                    block_size=16, max_num_seqs=max(16, args.n)))  # fmt: skip
    rng = random.Random(0)
    prompt = [rng.randrange(3, engine.model_config.vocab_size) for _ in range(args.prompt_tokens)]

    def params(**kw):
        return SamplingParams(temperature=1.0, max_tokens=args.max_tokens, ignore_eos=True, **kw)

    _measure(engine, lambda: engine.add_request("warm", prompt[:32], params(seed=1)))  # warm up
    forked = _measure(engine, lambda: engine.add_request("f", prompt, params(n=args.n, seed=args.seed)))

    def add_independent():
        for i in range(args.n):
            engine.add_request(f"i{i}", prompt, params(seed=args.seed + i))

    independent = _measure(engine, add_independent)
    # Without the prefix cache, independent requests share nothing (the forked samples still do).
    engine.block_manager.enable_prefix_caching = False
    uncached = _measure(engine, add_independent)
    engine.block_manager.enable_prefix_caching = True
    outputs = forked.pop("outputs")
    same = outputs == independent.pop("outputs") == uncached.pop("outputs")
    ratios = {k: round(independent[k] / forked[k], 2) for k in ("tokens_computed", "peak_blocks", "wall_s")}
    result = {"n": args.n, "prompt_tokens": args.prompt_tokens, "forked": forked, "independent": independent,
              "independent_no_prefix_cache": uncached, "ratios": ratios, "same_outputs": same}  # fmt: skip
    if not args.json:
        print(f"n={args.n} samples of a {args.prompt_tokens}-token prompt, {args.max_tokens} tokens each")
        sides = (
            ("forked (shared blocks)", forked),
            ("independent requests", independent),
            ("independent, no prefix cache", uncached),
        )
        for name, r in sides:
            print(
                f"  {name:30s} computed {r['tokens_computed']:6d} tokens, peak {r['peak_blocks']:4d} blocks, "
                f"{r['wall_s']:.3f} s"
            )
        print(f"  independent / forked: {ratios}; same outputs: {same}")
    print(json.dumps(result))
    return 0 if same else 1
