"""Engine benchmark: batch-1 and 32-way decode throughput against their rooflines and
transformers (both measured over decode steps, prefill excluded; the 32-way end-to-end rate is
printed beside), and TTFT of a 2,048-token prompt uncached vs with its prefix cached. Everything is measured in
this one run on this machine, so the ratios are meaningful even on a noisy host."""

from __future__ import annotations

import json
import time

import torch

from workers.bench.checkpoints import random_checkpoint
from workers.engine import LLM, SamplingParams


def _timeit(fn, repeat: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def memory_read_bandwidth(device: torch.device) -> float:
    """Bytes/s of a streaming reduction over a buffer much larger than the caches."""
    x = torch.ones(128 << 20, dtype=torch.float32, device=device)  # 512 MiB

    def read():
        x.sum()
        if device.type == "cuda":
            torch.cuda.synchronize()

    return x.numel() * 4 / _timeit(read)


def gemm_flops(device: torch.device, dtype: torch.dtype) -> float:
    n = 1024 if device.type == "cpu" else 8192
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)

    def mm():
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()

    return 2 * n**3 / _timeit(mm)


def _weights_read_per_step(model) -> int:
    """Bytes of the matrices a decode step reads: every linear layer (lm_head included)."""
    from workers.engine.layers.linear import Linear

    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, Linear))


def _end_to_end_rate(llm: LLM, prompts: list[list[int]], max_tokens: int) -> float:
    """Output tokens/s of `prompts` run together, their prefill included (as a user sees it)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    t = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    dt = time.perf_counter() - t
    return sum(len(o.outputs[0].token_ids) for o in outs) / dt


def _decode_steps_rate(llm: LLM, prompts: list[list[int]], steps: int) -> float:
    """Output tokens/s of decode steps with every prompt running, once all prefills are done: the
    figure the rooflines bound (they count the FLOPs and bytes of decoding, not of prompts)."""
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=steps + 2, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"decode-{i}", p, params)
    started: set[str] = set()
    while len(started) < len(prompts):  # prefill (chunked) until every request has its first token
        started.update(d.request_id for d in engine.step() if d.new_token_ids)
    t = time.perf_counter()
    tokens = sum(len(d.new_token_ids) for _ in range(steps) for d in engine.step())
    dt = time.perf_counter() - t
    while engine.has_unfinished_requests():
        engine.step()
    return tokens / dt


def _hf_generate_seconds(model, prompts, max_tokens, device) -> float:
    """Seconds for transformers' `generate` on `prompts` as one left-padded batch."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)

    def gen():
        with torch.inference_mode():
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=0,
            )

    return _timeit(gen, repeat=1)


def _hf_decode_rate(model, prompts, max_tokens, device) -> float:
    """transformers' decode tokens/s, measured like ours: the time of `max_tokens` new tokens
    minus the time of one (its prefill), over the tokens after the first."""
    full = _hf_generate_seconds(model, prompts, max_tokens, device)
    first = _hf_generate_seconds(model, prompts, 1, device)
    return len(prompts) * (max_tokens - 1) / (full - first)


def run(args) -> int:
    device = torch.device(args.device)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    model_dir = args.model or str(random_checkpoint())
    say = (lambda *a: None) if args.json else print
    say(f"model: {model_dir} on {device} ({args.dtype})")
    llm = LLM(
        model_dir,
        device=args.device,
        dtype=args.dtype,
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        kv_cache_bytes=2 << 30,
    )
    cfg = llm.engine.model_config
    n_out = 16 if args.quick else 64
    gen = torch.Generator().manual_seed(0)

    def prompt(n):
        return torch.randint(10, cfg.vocab_size - 1, (n,), generator=gen).tolist()

    bandwidth = memory_read_bandwidth(device)
    flops = gemm_flops(device, dtype)
    weight_bytes = _weights_read_per_step(llm.engine.model)
    flops_per_token = 2 * weight_bytes / llm.engine.dtype.itemsize
    results: dict[str, float | str] = {
        "memory_read_gb_s": round(bandwidth / 1e9, 2),
        "gemm_gflop_s": round(flops / 1e9, 1),
        "bandwidth_bound_tok_s": round(bandwidth / weight_bytes, 2),
        "compute_roofline_tok_s": round(flops / flops_per_token, 1),
    }

    bs1_prompt = prompt(32)
    _end_to_end_rate(llm, [bs1_prompt], 4)  # warm up
    results["bs1_tok_s"] = round(_decode_steps_rate(llm, [bs1_prompt], n_out), 2)
    say(
        f"batch 1: {results['bs1_tok_s']} tok/s; bandwidth bound {results['bandwidth_bound_tok_s']} tok/s "
        f"({results['memory_read_gb_s']} GB/s over {weight_bytes / 1e6:.0f} MB of weights per step)"
    )

    conc_prompts = [prompt(16 + 3 * i) for i in range(32)]
    # Warm up at this batch shape (first use of large buffers), as the transformers runs are.
    _end_to_end_rate(llm, [prompt(16 + 3 * i) for i in range(32)], 2)
    results["conc32_tok_s"] = round(_decode_steps_rate(llm, conc_prompts, n_out), 1)
    results["conc32_e2e_tok_s"] = round(_end_to_end_rate(llm, conc_prompts, n_out), 1)
    say(
        f"32 concurrent: {results['conc32_tok_s']} tok/s decoding ({results['conc32_e2e_tok_s']} tok/s with their "
        f"prefill); compute roofline {results['compute_roofline_tok_s']} tok/s ({results['gemm_gflop_s']} GFLOP/s)"
    )

    long_prompt = prompt(2048)
    llm.generate({"prompt_token_ids": prompt(2048)}, SamplingParams(max_tokens=1))  # warm-up, other tokens
    llm.engine.block_manager.reset_prefix_cache()
    p1 = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    t = time.perf_counter()
    llm.generate({"prompt_token_ids": long_prompt}, p1)
    results["ttft_uncached_ms"] = round((time.perf_counter() - t) * 1000, 1)
    cached_prompt = long_prompt[:-16] + prompt(16)
    t = time.perf_counter()
    out = llm.generate({"prompt_token_ids": cached_prompt}, p1)[0]
    results["ttft_cached_ms"] = round((time.perf_counter() - t) * 1000, 1)
    say(
        f"TTFT 2048 tokens: uncached {results['ttft_uncached_ms']} ms, cached prefix ({out.num_cached_tokens} "
        f"tokens) {results['ttft_cached_ms']} ms"
    )

    if not args.no_hf:
        del llm
        import transformers

        hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        results["hf_bs1_tok_s"] = round(_hf_decode_rate(hf, [bs1_prompt], n_out, device), 2)
        results["hf_conc32_tok_s"] = round(_hf_decode_rate(hf, conc_prompts, n_out, device), 1)
        say(
            f"transformers, decoding: batch 1 {results['hf_bs1_tok_s']} tok/s, 32 padded "
            f"{results['hf_conc32_tok_s']} tok/s"
        )

    results["bs1_vs_bandwidth"] = round(results["bs1_tok_s"] / results["bandwidth_bound_tok_s"], 3)
    results["conc32_vs_roofline"] = round(results["conc32_tok_s"] / results["compute_roofline_tok_s"], 3)
    results["ttft_speedup"] = round(results["ttft_uncached_ms"] / results["ttft_cached_ms"], 1)
    say(
        f"targets: bs1 >= 0.6x bandwidth bound: {results['bs1_vs_bandwidth']}; conc32 >= 0.4x roofline: "
        f"{results['conc32_vs_roofline']}; cached TTFT <= 1/8: {results['ttft_speedup']}x faster"
    )
    print(json.dumps(results))
    return 0
