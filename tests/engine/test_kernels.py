"""Each triton kernel equals its torch reference (under TRITON_INTERPRET=1 on CPU; on CUDA when
SWITCHYARD_TEST_DEVICE=cuda, as scripts/gpu_check.sh runs them, bf16 included)."""

import os

import pytest
import torch

from workers.engine.config import RopeConfig
from workers.engine.kernels import activation, kv_write, mla, paged_attention, quant_matmul, rmsnorm, rotary
from workers.engine.layers.rotary import cos_sin_table

DEVICE = os.environ.get("SWITCHYARD_TEST_DEVICE", "cpu")
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def close(a, b, dtype):
    assert torch.allclose(a.float(), b.float(), atol=TOL[dtype] * 5, rtol=TOL[dtype] * 5), (a - b).abs().max()


@pytest.fixture(params=DTYPES, ids=str)
def dtype(request):
    torch.manual_seed(0)
    return request.param


def rand(*shape, dtype):
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


def test_rms_norm(dtype):
    x, w = rand(7, 96, dtype=dtype), rand(96, dtype=dtype)
    close(rmsnorm.rms_norm_triton(x, w, 1e-6), rmsnorm.rms_norm_ref(x, w, 1e-6), dtype)


def test_silu_and_mul(dtype):
    x = rand(5, 2 * 300, dtype=dtype)
    close(activation.silu_and_mul_triton(x, block=128), activation.silu_and_mul_ref(x), dtype)


def test_rotary(dtype):
    table = cos_sin_table(32, 64, RopeConfig(theta=10000.0)).to(DEVICE)
    x = rand(6, 3, 32, dtype=dtype)
    pos = torch.tensor([0, 1, 5, 63, 17, 2], device=DEVICE)
    rows = table.index_select(0, pos)
    close(rotary.apply_rotary_triton(x, rows), rotary.apply_rotary_ref(x, rows), dtype)


def test_kv_write(dtype):
    kc_a, vc_a = rand(6, 16, 2, 32, dtype=dtype), rand(6, 16, 2, 32, dtype=dtype)
    kc_b, vc_b = kc_a.clone(), vc_a.clone()
    k, v = rand(5, 2, 32, dtype=dtype), rand(5, 2, 32, dtype=dtype)
    slots = torch.tensor([0, 17, 50, 95, 33], device=DEVICE)
    kv_write.write_kv_ref(k, v, kc_a, vc_a, slots)
    kv_write.write_kv_triton(k, v, kc_b, vc_b, slots)
    assert torch.equal(kc_a, kc_b) and torch.equal(vc_a, vc_b)


@pytest.fixture
def paged(dtype):
    blocks, bs, kv_heads, head_dim = 12, 16, 2, 32
    kc, vc = rand(blocks, bs, kv_heads, head_dim, dtype=dtype), rand(blocks, bs, kv_heads, head_dim, dtype=dtype)
    tables = torch.tensor([[3, 5, 7, 0], [1, 2, 0, 0], [11, 10, 9, 8]], dtype=torch.int32, device=DEVICE)
    ctx = torch.tensor([40, 17, 64], dtype=torch.int32, device=DEVICE)
    return kc, vc, tables, ctx


def test_paged_decode_gqa(dtype, paged):
    kc, vc, tables, ctx = paged
    q = rand(3, 4, 32, dtype=dtype)
    close(
        paged_attention.paged_decode_triton(q, kc, vc, tables, ctx, 0.17),
        paged_attention.paged_decode_ref(q, kc, vc, tables, ctx, 0.17),
        dtype,
    )


def test_paged_prefill_over_a_cached_prefix(dtype, paged):
    kc, vc, tables, ctx = paged
    # seq 0: 20 new tokens after 20 cached; seq 1: whole prompt (17); seq 2: 3 new after 61 cached.
    cu = torch.tensor([0, 20, 37, 40], dtype=torch.int32, device=DEVICE)
    q = rand(40, 4, 32, dtype=dtype)
    close(
        paged_attention.paged_prefill_triton(q, kc, vc, tables, cu, ctx, 0.17),
        paged_attention.paged_prefill_ref(q, kc, vc, tables, cu, ctx, 0.17),
        dtype,
    )


def test_prefill_reference_equals_dense_causal_attention():
    """The reference itself: a whole prompt laid out in scattered blocks equals plain attention."""
    torch.manual_seed(1)
    k, v, q = torch.randn(20, 2, 8), torch.randn(20, 2, 8), torch.randn(20, 4, 8)
    kc, vc = torch.zeros(8, 4, 2, 8), torch.zeros(8, 4, 2, 8)
    table = torch.tensor([[6, 1, 4, 0, 3]], dtype=torch.int32)
    slots = torch.tensor([int(table[0, p // 4]) * 4 + p % 4 for p in range(20)])
    kv_write.write_kv_ref(k, v, kc, vc, slots)
    out = paged_attention.paged_prefill_ref(q, kc, vc, table, torch.tensor([0, 20]), torch.tensor([20]), 0.3)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = torch.einsum("qhd,khd->hqk", q, kk) * 0.3
    scores = scores.masked_fill(torch.ones(20, 20).triu(1).bool(), float("-inf"))
    dense = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv)
    assert torch.allclose(out, dense, atol=1e-5)


@pytest.mark.parametrize("new", [3, paged_attention.ADDITIVE_MASK_MAX_QUERIES + 8])
def test_prefill_reference_after_a_cached_prefix_equals_dense_attention(new):
    """A chunk after cached context (a verify step's few queries get an additive mask, a long
    chunk a boolean one) attends to the prefix and causally within itself."""
    torch.manual_seed(2)
    total = 50 + new
    k, v, q = torch.randn(total, 2, 8), torch.randn(total, 2, 8), torch.randn(new, 4, 8)
    kc, vc = torch.zeros(32, 4, 2, 8), torch.zeros(32, 4, 2, 8)
    table = torch.randperm(32)[: -(-total // 4)][None].to(torch.int32)
    slots = torch.tensor([int(table[0, p // 4]) * 4 + p % 4 for p in range(total)])
    kv_write.write_kv_ref(k, v, kc, vc, slots)
    cu, ctx = torch.tensor([0, new]), torch.tensor([total])
    plan = paged_attention.plan_prefill(table, cu, ctx, 4, torch.float32)
    assert plan[0].mask.dtype == (torch.float32 if new <= paged_attention.ADDITIVE_MASK_MAX_QUERIES else torch.bool)
    out = paged_attention.paged_prefill_ref(q, kc, vc, table, cu, ctx, 0.3, plan)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = torch.einsum("qhd,khd->hqk", q, kk) * 0.3
    future = torch.arange(total)[None, :] > torch.arange(total - new, total)[:, None]
    dense = torch.einsum("hqk,khd->qhd", scores.masked_fill(future, float("-inf")).softmax(-1), vv)
    assert torch.allclose(out, dense, atol=1e-5)


def test_paged_decode_ref_groups_very_different_lengths_without_changing_results(dtype):
    blocks, bs, kv_heads, head_dim = 40, 8, 2, 32
    kc, vc = rand(blocks, bs, kv_heads, head_dim, dtype=dtype), rand(blocks, bs, kv_heads, head_dim, dtype=dtype)
    tables = torch.arange(3 * 30, dtype=torch.int32, device=DEVICE).remainder(blocks).view(3, 30)
    ctx = torch.tensor([5, 230, 9], dtype=torch.int32, device=DEVICE)  # the long one gets its own group
    q = rand(3, 4, 32, dtype=dtype)
    grouped = paged_attention.paged_decode_ref(q, kc, vc, tables, ctx, 0.17)
    assert len(paged_attention.plan_decode(tables, ctx, bs, dtype)) == 2  # the long context alone
    one_group = [paged_attention.DecodeGroup(None, tables.reshape(-1), 30, _padding_mask(ctx, 30 * bs, dtype))]
    close(grouped, paged_attention.paged_decode_ref(q, kc, vc, tables, ctx, 0.17, one_group), dtype)
    close(grouped, paged_attention.paged_decode_triton(q, kc, vc, tables, ctx, 0.17), dtype)


def test_decode_reference_equals_dense_attention():
    """The decode reference itself: each sequence's one query against its own scattered context
    (GQA, padding past its length ignored) equals plain softmax attention."""
    torch.manual_seed(2)
    kc, vc = torch.randn(10, 4, 2, 8), torch.randn(10, 4, 2, 8)
    tables = torch.tensor([[7, 2, 9], [4, 0, 0]], dtype=torch.int32)
    ctx = torch.tensor([11, 3])
    q = torch.randn(2, 4, 8)
    out = paged_attention.paged_decode_ref(q, kc, vc, tables, ctx, 0.3)
    for s in range(2):
        k = kc[tables[s].long()].flatten(0, 1)[: ctx[s]].repeat_interleave(2, 1)
        v = vc[tables[s].long()].flatten(0, 1)[: ctx[s]].repeat_interleave(2, 1)
        probs = (torch.einsum("hd,khd->hk", q[s], k) * 0.3).softmax(-1)
        assert torch.allclose(out[s], torch.einsum("hk,khd->hd", probs, v), atol=1e-5)


def _padding_mask(ctx, width, dtype):
    mask = torch.zeros(len(ctx), 1, 1, width, dtype=dtype, device=DEVICE)
    return mask.masked_fill_(
        (torch.arange(width, device=DEVICE) >= ctx[:, None]).view(len(ctx), 1, 1, -1), float("-inf")
    )


def _latent_cache(dtype, blocks=10, bs=16, lora=64, rope=16):
    cache = rand(blocks, bs, lora + rope, dtype=dtype)
    tables = torch.tensor([[3, 5, 7, 0], [1, 2, 0, 0], [9, 8, 6, 4]], dtype=torch.int32, device=DEVICE)
    return cache, tables, torch.tensor([40, 17, 64], dtype=torch.int32, device=DEVICE)


def test_mla_decode_absorbed(dtype):
    """Absorbed MLA decode (one latent key per token shared by all heads), 20 heads: two head
    blocks of the kernel, the second partly masked."""
    cache, tables, ctx = _latent_cache(dtype)
    q = rand(3, 20, 80, dtype=dtype)
    close(
        mla.mla_decode_triton(q, cache, tables, ctx, 64, 0.11),
        mla.mla_decode_ref(q, cache, tables, ctx, 64, 0.11),
        dtype,
    )


def test_mla_absorbed_decode_equals_expanded_attention():
    """The reference itself: W_UK folded into the query and W_UV applied after equal attention
    over keys and values expanded from the latent (what transformers computes)."""
    torch.manual_seed(2)
    heads, nope, rope, v_dim, lora, ctx = 4, 8, 6, 5, 12, 21
    cache = torch.randn(4, 8, lora + rope)
    table = torch.tensor([[2, 0, 3]], dtype=torch.int32)
    rows = cache.index_select(0, table[0].long()).flatten(0, 1)[:ctx]
    latent, k_pe = rows[:, :lora], rows[:, lora:]
    w_uk, w_uv = torch.randn(heads, nope, lora), torch.randn(heads, v_dim, lora)
    q_nope, q_pe = torch.randn(heads, nope), torch.randn(heads, rope)
    k = torch.cat((torch.einsum("hnc,tc->htn", w_uk, latent), k_pe.expand(heads, ctx, rope)), -1)
    v = torch.einsum("hvc,tc->htv", w_uv, latent)
    scores = torch.einsum("hd,htd->ht", torch.cat((q_nope, q_pe), -1), k) * 0.2
    expanded = torch.einsum("ht,htv->hv", scores.softmax(-1), v)
    q = torch.cat((torch.einsum("hn,hnc->hc", q_nope, w_uk), q_pe), -1)[None]
    o_lat = mla.mla_decode_ref(q, cache, table, torch.tensor([ctx], dtype=torch.int32), lora, 0.2)
    assert torch.allclose(torch.einsum("hc,hvc->hv", o_lat[0], w_uv), expanded, atol=1e-5)


@pytest.mark.parametrize("m", [1, 21])
def test_int4_matmul_dequantizes_in_kernel(dtype, m):
    # 70 inputs: a partial int32 word and a partial scale group at the row's end.
    g = torch.Generator().manual_seed(3)
    q = torch.randint(-8, 8, (45, 70), dtype=torch.int8, generator=g)
    packed = quant_matmul.pack_int4(q).to(DEVICE)
    scale = (torch.rand(45, 3, generator=g) * 0.1).to(DEVICE, dtype)
    x = rand(m, 70, dtype=dtype)
    want = quant_matmul.int4_matmul_ref(x.float(), packed, scale.float(), 32, 70)
    got = quant_matmul.int4_matmul_triton(x, packed, scale, 32, 70, block_k=32)
    assert got.dtype == dtype and got.shape == (m, 45)
    close(got / want.abs().max(), want / want.abs().max(), dtype)


@pytest.mark.parametrize("m", [1, 21])
def test_fp8_block_matmul_dequantizes_in_kernel(dtype, m):
    g = torch.Generator().manual_seed(4)
    weight = torch.randn(45, 70, generator=g).to(torch.float8_e4m3fn).to(DEVICE)
    scale_inv = torch.rand(2, 3, generator=g).to(DEVICE)  # 32×32 blocks, the last ones partial
    x = rand(m, 70, dtype=dtype)
    want = quant_matmul.fp8_block_matmul_ref(x.float(), weight, scale_inv, (32, 32))
    got = quant_matmul.fp8_block_matmul_triton(x, weight, scale_inv, (32, 32))
    assert got.dtype == dtype and got.shape == (m, 45)
    close(got / want.abs().max(), want / want.abs().max(), dtype)
