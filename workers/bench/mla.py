"""MLA benchmark: absorbed vs expanded decode attention at a long context, and KV-cache bytes
per token of the latent cache against GQA and MHA caches of the same model.

One DeepSeek-V3 attention layer (kv_lora_rank 512, rope 64, nope 128, v 128) with `--heads`
heads (default 16: one tensor-parallel rank's share of DeepSeek-V3's 128 at TP=8), random
weights, a paged latent cache filled for `--batch` sequences of `--context` tokens. Each round
times one decode step of attention both ways, in alternating order, on the same inputs:

* absorbed (what the engine runs): W_UK folded into the query, attention over the latent rows,
  W_UV after (layers/mla.py `_decode`, kernels/mla.py);
* expanded: the latent of every context token turned back into per-head keys and values
  (kv_b_proj), then attention (the prefill path, `_prefill`, one query per sequence).

Both outputs are compared (max abs difference printed). Times are medians over rounds.
Bytes per token: the whole model (61 layers, bf16): MLA 61 × (512 + 64) values; GQA the same
model with 8 KV heads of 128 (K and V); MHA its 128 heads with K of 192 and V of 128.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from workers.engine import kernels
from workers.engine.config import MLAConfig, ModelConfig, RopeConfig
from workers.engine.layers.attention import AttentionMetadata
from workers.engine.layers.linear import Linear
from workers.engine.layers.mla import MLAttention

LAYERS, LORA, ROPE, NOPE, V = 61, 512, 64, 128, 128


def _layer(heads: int, device, dtype) -> MLAttention:
    mla = MLAConfig(None, LORA, NOPE, ROPE, V, rope_interleave=True)
    cfg = ModelConfig(
        architecture="DeepseekV3ForCausalLM", model_type="deepseek_v3", vocab_size=8, hidden_size=1024,
        intermediate_size=8, num_layers=1, num_heads=heads, num_kv_heads=heads, head_dim=NOPE + ROPE,
        rms_norm_eps=1e-6, max_position_embeddings=8, max_context=8, rope=RopeConfig(), tie_word_embeddings=False,
        mla=mla,
    )  # fmt: skip
    layer = MLAttention(cfg, lambda i, o, name: Linear(i, o, bias=False)).to(device=device, dtype=dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.05)
    for m in layer.modules():
        if isinstance(m, Linear):
            m.prepare()
    layer.prepare()
    return layer


def _timed(fn, repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - started) / repeat


def kv_bytes_per_token() -> dict[str, int]:
    return {
        "mla": LAYERS * (LORA + ROPE) * 2,
        "gqa": LAYERS * 2 * 8 * 128 * 2,
        "mha": LAYERS * 128 * ((NOPE + ROPE) + V) * 2,
    }


@torch.inference_mode()
def run(args) -> int:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch.manual_seed(0)
    layer = _layer(args.heads, device, dtype)
    bs, ctx, batch = 16, args.context, args.batch
    per_seq = -(-ctx // bs)
    cache = torch.randn(1, batch * per_seq, bs, 1, LORA + ROPE, device=device, dtype=dtype) * 0.5
    layer.bind_kv_cache(cache)
    tables = torch.arange(batch * per_seq, dtype=torch.int32, device=device).view(batch, per_seq)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    meta = AttentionMetadata(slot_mapping=torch.zeros(batch, dtype=torch.int64, device=device), num_prefill_tokens=0)
    meta.decode_block_tables, meta.decode_context_lens = tables, lens
    if not kernels.use_triton(tables):
        meta.decode_plan = kernels.plan_decode(tables, lens, bs, dtype)
    meta.prefill_block_tables, meta.prefill_context_lens = tables, lens
    meta.prefill_cu_q_lens = torch.arange(batch + 1, dtype=torch.int32, device=device)
    q_nope = torch.randn(batch, args.heads, NOPE, device=device, dtype=dtype)
    q_pe = torch.randn(batch, args.heads, ROPE, device=device, dtype=dtype)
    absorbed = lambda: layer._decode(q_nope, q_pe, meta)  # noqa: E731
    expanded = lambda: layer._prefill(q_nope, q_pe, meta)  # noqa: E731
    diff = float((absorbed().float() - expanded().float()).abs().max())
    times = {"absorbed": [], "expanded": []}
    for r in range(args.rounds):
        for name in ("absorbed", "expanded") if r % 2 == 0 else ("expanded", "absorbed"):
            times[name].append(_timed(absorbed if name == "absorbed" else expanded, args.repeat))
    a_ms, e_ms = (statistics.median(times[k]) * 1e3 for k in ("absorbed", "expanded"))
    kv = kv_bytes_per_token()
    result = {
        "context": ctx,
        "batch": batch,
        "heads": args.heads,
        "absorbed_ms": round(a_ms, 3),
        "expanded_ms": round(e_ms, 3),
        "absorbed_speedup": round(e_ms / a_ms, 2),
        "max_abs_diff": diff,
        "mla_kv_bytes_per_token": kv["mla"],
        "gqa_kv_bytes_per_token": kv["gqa"],
        "mha_kv_bytes_per_token": kv["mha"],
        "gqa_over_mla": round(kv["gqa"] / kv["mla"], 2),
        "mha_over_mla": round(kv["mha"] / kv["mla"], 2),
    }
    if not args.json:
        print(f"MLA decode attention, {args.heads} heads, batch {batch} at context {ctx}, {args.device} {args.dtype}")
        print(f"  absorbed (latent cache read as is)   {a_ms:9.3f} ms / step")
        print(f"  expanded (K/V rebuilt from latents)  {e_ms:9.3f} ms / step   ({e_ms / a_ms:.1f}x the absorbed)")
        print(f"  outputs agree within {diff:.2e}")
        print("KV cache per token, whole model (61 layers, bf16):")
        print(f"  MLA latent + rope key  {kv['mla']:>9,} B  ({kv['mla'] / 1024:.1f} KiB)")
        print(f"  GQA, 8 KV heads × 128  {kv['gqa']:>9,} B  ({kv['gqa'] / kv['mla']:.1f}x MLA)")
        print(f"  MHA, 128 heads         {kv['mha']:>9,} B  ({kv['mha'] / kv['mla']:.1f}x MLA)")
    print(json.dumps(result))
    return 0
