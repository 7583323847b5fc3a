"""KV layout agreement and block addressing.

The engine keeps one KV tensor per replica, shaped [layers, parts, blocks, block_size, heads,
width] and contiguous (workers/engine/kv_layout.py): parts 2 (k, v) with heads = KV heads and
width = head_dim for dense models; parts 1, heads 1, width = latent + rope key for MLA. Block
`b` of layer `l`, part `p` starts at base + ((l * parts + p) * num_blocks + b) * block_bytes.
Two replicas may have different numbers of blocks; everything else in the layout must match
or the bytes would mean something else (a dense and an MLA cache never exchange blocks).
"""

from __future__ import annotations

# Keys of LLMEngine.kv_layout() that must be equal on both sides.
MUST_MATCH = (
    "architecture",
    "kv_layout",
    "kv_parts",
    "dtype",
    "block_size",
    "num_layers",
    "num_kv_heads",
    "head_dim",
    "tp_rank",
    "tp_size",
    "pp_rank",
    "pp_size",
)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


class KVTransferError(Exception):
    """A transfer could not be done; the decode replica then prefills by itself."""


def layout_mismatch(local: dict, remote: dict) -> str | None:
    """None when the layouts agree, else a sentence naming each difference."""
    diffs = [
        f"{k}: {local.get(k)!r} here, {remote.get(k)!r} there" for k in MUST_MATCH if local.get(k) != remote.get(k)
    ]
    if local.get("model") and remote.get("model") and local["model"] != remote["model"]:
        diffs.insert(0, f"model: {local['model']!r} here, {remote['model']!r} there")
    return "KV layouts differ (" + "; ".join(diffs) + ")" if diffs else None


def ranks_mismatch(local: dict, remote: dict) -> str | None:
    """None when two transfer endpoints have the same ranks with agreeing layouts, rank by rank
    (a parallel replica's endpoint lists its ranks; a single-device one has none), else why."""
    mine, theirs = local.get("ranks") or [], remote.get("ranks") or []
    if len(mine) != len(theirs):
        return f"KV layouts differ (ranks: {len(mine) or 1} here, {len(theirs) or 1} there)"
    for rank, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        problem = layout_mismatch(a.get("layout") or {}, b.get("layout") or {})
        if problem is not None:
            return f"rank {rank}: {problem}"
    return None


def block_bytes(layout: dict) -> int:
    return layout["block_size"] * layout["num_kv_heads"] * layout["head_dim"] * DTYPE_BYTES[layout["dtype"]]


def block_segments(base: int, layout: dict, block_ids: list[int]) -> list[int]:
    """Start addresses of every (layer, part, block) segment, in a fixed order both sides share;
    each segment is `block_bytes(layout)` long."""
    size = block_bytes(layout)
    n = layout["num_blocks"]
    parts = layout.get("kv_parts", 2)
    return [
        base + ((layer * parts + part) * n + b) * size
        for layer in range(layout["num_layers"])
        for part in range(parts)
        for b in block_ids
    ]
