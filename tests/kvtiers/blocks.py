"""Packed blocks for the tier tests: random K/V bytes under a real chained hash and key."""

from __future__ import annotations

import random

from workers.kvtiers import block_key, fingerprint, pack_block
from workers.protocol.kv_blocks import chain_hash

FP = fingerprint({"model": "test", "dtype": "float32", "block_size": 4, "num_layers": 2})


def make_block(i: int, data_bytes: int = 1024, seed: int = 0) -> tuple[str, int, bytes]:
    """(key, hash, payload) of a block of 4 tokens whose data is `data_bytes` random bytes."""
    rng = random.Random(seed * 1_000_003 + i)
    tokens = [rng.randrange(32_000) for _ in range(4)]
    h = chain_hash(None, tokens)
    return block_key(FP, h), h, pack_block(h, tokens, rng.randbytes(data_bytes))


def make_blocks(n: int, data_bytes: int = 1024, seed: int = 0) -> list[tuple[str, int, bytes]]:
    return [make_block(i, data_bytes, seed) for i in range(n)]


def keys_and_hashes(items: list[tuple[str, int, bytes]]) -> tuple[list[str], list[int]]:
    return [k for k, _, _ in items], [h for _, h, _ in items]
