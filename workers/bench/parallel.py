"""Tensor and pipeline parallelism on this machine's CPU: tp=1 vs tp=2 vs pp=2 on the same
random checkpoint, one core per rank (gloo between the ranks).

Per layout: decode tokens/s at batch 1 and 16 (steps after every prefill is done), TTFT of a
2k-token prompt, weight bytes per rank, and whether the greedy tokens equal tp=1's. The last
line is one JSON object: {"runs": [{"tp", "pp", "bs1_tok_s", "bs16_tok_s", "ttft_2k_ms",
"weight_bytes_per_rank", "identical"}, ...]}."""

from __future__ import annotations

import json
import random
import time

import torch

from workers.bench.checkpoints import random_checkpoint
from workers.bench.engine import _decode_steps_rate
from workers.engine import LLM, SamplingParams

# Heads and KV heads split over 2 ranks; 2k context for the TTFT prompt.
SHAPE = dict(
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
    vocab_size=32000,
    tie_word_embeddings=False,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
)
QUICK_SHAPE = {**SHAPE, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "vocab_size": 1024}
LAYOUTS = ((1, 1), (2, 1), (1, 2))


def measure(model_dir: str, tp: int, pp: int, quick: bool) -> tuple[dict, list[list[int]]]:
    rng = random.Random(0)
    vocab = QUICK_SHAPE["vocab_size"] if quick else SHAPE["vocab_size"]
    prompt_len = 256 if quick else 2048
    steps = 4 if quick else 32
    torch.set_num_threads(1)
    llm = LLM(
        model_dir,
        dtype="float32",
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        parallel_threads_per_rank=1,
        max_num_batched_tokens=4096,
        kv_cache_bytes=256 << 20,
        enable_prefix_caching=False,
    )
    try:
        greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        check = [[rng.randrange(vocab) for _ in range(16)] for _ in range(4)]
        tokens = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in check], greedy)]
        bs1 = _decode_steps_rate(llm, [[rng.randrange(vocab) for _ in range(16)]], steps)
        bs16 = _decode_steps_rate(llm, [[rng.randrange(vocab) for _ in range(16)] for _ in range(16)], steps)
        long = [rng.randrange(vocab) for _ in range(prompt_len)]
        t = time.perf_counter()
        llm.generate({"prompt_token_ids": long}, SamplingParams(temperature=0.0, max_tokens=1))
        ttft = (time.perf_counter() - t) * 1000
        weights = [m["weights"] for m in llm.engine.rank_memory()]
    finally:
        llm.close()
    run = {
        "tp": tp,
        "pp": pp,
        "bs1_tok_s": round(bs1, 2),
        "bs16_tok_s": round(bs16, 2),
        "ttft_2k_ms": round(ttft, 1),
        "weight_bytes_per_rank": max(weights),
    }
    return run, tokens


def run(args) -> int:
    quick = args.quick
    model_dir = args.model or str(
        random_checkpoint("parallel-quick" if quick else "parallel-bench", QUICK_SHAPE if quick else SHAPE)
    )
    runs, reference = [], None
    for tp, pp in LAYOUTS:
        result, tokens = measure(model_dir, tp, pp, quick)
        reference = tokens if reference is None else reference
        result["identical"] = tokens == reference
        runs.append(result)
        if not args.json:
            print(
                f"tp={tp} pp={pp}: decode {result['bs1_tok_s']} tok/s at batch 1, {result['bs16_tok_s']} at 16; "
                f"TTFT {result['ttft_2k_ms']} ms ({'256' if quick else '2k'} tokens); "
                f"{result['weight_bytes_per_rank'] / 2**20:.1f} MiB weights per rank; identical: {result['identical']}",
                flush=True,
            )
    if not args.json:
        base = runs[0]
        for r in runs[1:]:
            print(
                f"tp={r['tp']} pp={r['pp']} vs tp=1: batch 1 x{r['bs1_tok_s'] / base['bs1_tok_s']:.2f}, "
                f"batch 16 x{r['bs16_tok_s'] / base['bs16_tok_s']:.2f}, "
                f"TTFT x{r['ttft_2k_ms'] / base['ttft_2k_ms']:.2f}, "
                f"weights per rank x{r['weight_bytes_per_rank'] / base['weight_bytes_per_rank']:.2f}"
            )
    print(json.dumps({"runs": runs}))
    return 0 if all(r["identical"] for r in runs) else 1
