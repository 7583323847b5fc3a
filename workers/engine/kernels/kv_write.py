"""KV-cache write: scatter each token's K and V into its slot of the paged cache.

Caches are [num_blocks, block_size, kv_heads, head_dim]; slot = block * block_size + offset.
"""

from workers.engine.kernels._triton import jit, next_pow2, tl


def write_kv_ref(k, v, k_cache, v_cache, slot_mapping) -> None:
    kvh, hd = k_cache.shape[-2:]
    k_cache.view(-1, kvh, hd).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, kvh, hd).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


@jit
def _write_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, width, BLOCK: tl.constexpr):
    tok = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < width
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    kk = tl.load(k_ptr + tok * width + offs, mask=mask)
    vv = tl.load(v_ptr + tok * width + offs, mask=mask)
    tl.store(kc_ptr + slot * width + offs, kk, mask=mask)
    tl.store(vc_ptr + slot * width + offs, vv, mask=mask)


def write_kv_triton(k, v, k_cache, v_cache, slot_mapping) -> None:
    width = k.shape[-2] * k.shape[-1]
    if k.shape[0]:
        _write_kv_kernel[(k.shape[0],)](
            k.contiguous(),
            v.contiguous(),
            k_cache,
            v_cache,
            slot_mapping.contiguous(),
            width,
            BLOCK=next_pow2(width),
        )
