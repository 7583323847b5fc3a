"""Quantized weights benchmark: resident weight bytes and batch-1 decode tokens/s of a random
checkpoint with SmolLM-135M's layer shapes (4 of its 30 layers, to keep the CPU run short),
dense (fp32), as int4 pack-quantized (group 32, every linear layer; the tied head stays dense)
and as fp8 with 128×128 block scales, measured side by side in this run.

On CPU the quantized layers take the torch reference path (dequantize the matrix, then
multiply), so they save memory, not time: expect them much slower than dense here. The triton
kernels that dequantize in-kernel on CUDA are measured only when run with --device cuda.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from workers.bench.checkpoints import SMOLLM_135M_SHAPE, random_checkpoint
from workers.bench.quant_checkpoints import fp8_config, int4_config, write_quantized
from workers.engine import LLM, SamplingParams
from workers.engine.memory import weight_bytes


def _decode_rate(llm: LLM, tokens: int) -> float:
    """Batch-1 decode tokens/s, prefill excluded: (time of 1 + n tokens − time of 1) / n."""

    def run(n: int, seed: int) -> float:
        prompt = [(seed * 7 + i) % 1000 + 10 for i in range(16)]
        t = time.perf_counter()
        llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
        return time.perf_counter() - t

    run(2, 0)  # warm-up
    best = float("inf")
    for seed in range(1, 3):
        best = min(best, run(1 + tokens, seed) - run(1, seed + 100))
    return tokens / best


def run(args) -> int:
    src = random_checkpoint("smollm-135m-shape-4-layers", {**SMOLLM_135M_SHAPE, "num_hidden_layers": 4})
    tokens = 4 if args.quick else 16
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dirs = {"dense": src}
        dirs["int4"], _ = write_quantized(src, root / "int4", root / "int4_twin", int4_config(ignore=("lm_head",)))
        dirs["fp8"], _ = write_quantized(src, root / "fp8", root / "fp8_twin", fp8_config((128, 128)))
        for name, directory in dirs.items():
            llm = LLM(str(directory), device=args.device, dtype="float32")
            model = llm.engine.model
            # The decoder layers alone: where the quantized matrices are (the embedding stays dense).
            rows[name] = (weight_bytes(model), weight_bytes(model.model.layers), _decode_rate(llm, tokens))
            del llm
    dense_bytes, dense_layers, dense_rate = rows["dense"]
    if not args.json:
        print(
            f"random SmolLM-135M layer shapes, 4 layers, {args.device}, fp32 activations, "
            f"batch-1 decode over {tokens} tokens"
        )
        head = f"{'weights':<8}{'resident MiB':>14}{'vs dense':>10}{'layers MiB':>12}{'vs dense':>10}"
        print(head + f"{'decode tok/s':>14}{'vs dense':>10}")
        for name, (nbytes, layers, rate) in rows.items():
            print(
                f"{name:<8}{nbytes / 2**20:>14.1f}{nbytes / dense_bytes:>10.3f}{layers / 2**20:>12.1f}"
                f"{layers / dense_layers:>10.3f}{rate:>14.1f}{rate / dense_rate:>10.2f}"
            )
    result = {"device": args.device, "decode_tokens": tokens}
    for name, (nbytes, layers, rate) in rows.items():
        result[f"weight_bytes_{name}"] = nbytes
        result[f"layer_weight_bytes_{name}"] = layers
        result[f"decode_tok_s_{name}"] = round(rate, 2)
    print(json.dumps(result))
    return 0
