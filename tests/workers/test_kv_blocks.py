"""The KV-block contract routers and replicas share (workers/protocol/kv_blocks.py): the chained
block hash, the prompt prefix a router asks about, the block manager's stored/removed events that
keep a replica's published set equal to its prefix cache, and the longest-prefix lookup against
real Redis."""

from __future__ import annotations

import asyncio
import hashlib
import random

import numpy as np
import pytest
import redis
import redis.asyncio
from django.conf import settings

from workers.engine.block_manager import BlockManager
from workers.engine.sampling_params import SamplingParams
from workers.engine.sequence import Sequence
from workers.protocol.kv_blocks import cached_blocks, chain_hash, kv_index_key, kv_members, prefix_hashes


def numpy_chain_hash(prev, token_ids) -> int:
    """The engine's formula before it moved to the protocol package."""
    h = hashlib.blake2b(digest_size=8)
    h.update((prev if prev is not None else 0).to_bytes(8, "little", signed=False))
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little")


def seq(tokens, rid="r") -> Sequence:
    return Sequence(rid, list(tokens), SamplingParams(max_tokens=4))


def prefill(bm: BlockManager, s: Sequence) -> int:
    cached = bm.allocate(s, 10_000)
    assert cached is not None
    bm.mark_computed(s, s.num_tokens - s.num_computed_tokens)
    return cached


def test_chain_hash_is_bit_identical_to_the_numpy_formula():
    rng = random.Random(7)
    for _ in range(500):
        tokens = [rng.randrange(-(2**40), 2**40) for _ in range(rng.randrange(0, 40))]
        prev = rng.choice([None, 0, rng.randrange(2**64)])
        assert chain_hash(prev, tokens) == numpy_chain_hash(prev, tokens)
        assert chain_hash(prev, tuple(tokens)) == chain_hash(prev, tokens)


@pytest.mark.parametrize(
    ("n", "expected"),
    [(0, 0), (1, 0), (4, 0), (5, 1), (8, 1), (9, 2), (12, 2), (13, 3)],
)
def test_prefix_hashes_are_the_full_blocks_the_engine_could_reuse(n, expected):
    """Block size 4: a full last block is left out, since the engine computes the last token."""
    tokens = list(range(100, 100 + n))
    hashes = prefix_hashes(tokens, 4)
    assert len(hashes) == expected
    prev = None
    for i, h in enumerate(hashes):
        prev = chain_hash(prev, tokens[i * 4 : (i + 1) * 4])
        assert h == prev


@pytest.mark.parametrize("n", [8, 9, 10, 11, 12, 13])
def test_prefix_hashes_predict_the_cached_tokens_the_engine_reports(n):
    bm = BlockManager(num_blocks=16, block_size=4)
    tokens = list(range(30, 30 + n))
    a = seq(tokens, "a")
    prefill(bm, a)
    hashes = prefix_hashes(tokens, 4)
    assert a.block_hashes[: len(hashes)] == hashes
    assert set(hashes) <= set(bm.hash_to_block)
    assert bm.allocate(seq(tokens, "b"), 10_000) == len(hashes) * 4


def test_block_manager_reports_stored_evicted_and_reset_hashes():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = seq([1, 2, 3, 4, 5], "a")  # blocks [1,2] [3,4] [5]
    prefill(bm, a)
    h1 = chain_hash(None, [1, 2])
    h2 = chain_hash(h1, [3, 4])
    assert bm.take_kv_events() == ([h1, h2], [])
    assert bm.take_kv_events() == ([], [])  # taken once
    bm.free(a)  # freed blocks stay cached: no event
    assert bm.take_kv_events() == ([], [])

    b = seq([7, 8, 9, 10, 11, 12, 13], "b")  # needs 4 blocks: 2 free, then [3,4] and [1,2] evicted
    prefill(bm, b)
    stored, removed = bm.take_kv_events()
    assert sorted(removed) == sorted([h1, h2])
    assert len(stored) == 3 and set(stored) == set(bm.hash_to_block)
    bm.free(b)
    bm.reset_prefix_cache()
    stored2, removed2 = bm.take_kv_events()
    assert stored2 == [] and sorted(removed2) == sorted(stored)
    assert bm.hash_to_block == {}


def test_a_hash_stored_and_evicted_within_one_batch_leaves_no_event():
    bm = BlockManager(num_blocks=2, block_size=2)
    a = seq([1, 2, 3], "a")
    prefill(bm, a)
    bm.free(a)
    prefill(bm, seq([5, 6, 7], "b"))  # evicts [1,2] before anyone took its store
    stored, removed = bm.take_kv_events()
    assert stored == [chain_hash(None, [5, 6])] and removed == []


def test_a_hash_removed_then_stored_again_within_one_batch_stays_present():
    bm = BlockManager(num_blocks=2, block_size=2)
    tokens = [1, 2, 3]
    h = chain_hash(None, [1, 2])
    a = seq(tokens, "a")
    prefill(bm, a)
    bm.free(a)
    assert bm.take_kv_events() == ([h], [])  # published: the set holds h
    bm.reset_prefix_cache()  # removed...
    prefill(bm, seq(tokens, "b"))  # ...and computed again
    assert h in bm.hash_to_block
    stored, removed = bm.take_kv_events()
    published = ({h} | set(stored)) - set(removed)
    assert published == set(bm.hash_to_block) == {h}


def test_blocks_filled_by_another_replica_join_the_cache_and_are_reported():
    """The decode side of disaggregation: reserved blocks get their hashes once the prompt is
    in (LLMEngine.add_prefilled_request marks them computed)."""
    bm = BlockManager(num_blocks=8, block_size=4)
    blocks = bm.reserve(10)
    assert bm.take_kv_events() == ([], [])
    s = seq(range(40, 50))
    s.block_table = list(blocks)
    bm.mark_computed(s, 10)
    stored, removed = bm.take_kv_events()
    assert stored == s.block_hashes == prefix_hashes(list(range(40, 50)), 4) and removed == []
    # Reserved but never filled: back uncached, nothing to report.
    bm.release(bm.reserve(8))
    assert bm.take_kv_events() == ([], [])


def test_no_events_without_prefix_caching():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=False)
    a = seq([1, 2, 3, 4, 5])
    prefill(bm, a)
    bm.free(a)
    bm.reset_prefix_cache()
    assert bm.take_kv_events() == ([], []) and bm.take_kv_snapshot() == []


def test_applying_the_events_keeps_the_published_set_equal_to_the_cache():
    """A random workload (admissions sharing prefixes, chunked prefill, decode, frees, reserved
    blocks filled or released, cache resets) with events taken at random points: the set they
    build is always the block manager's hash_to_block."""
    rng = random.Random(20240613)
    bs = 4
    bm = BlockManager(num_blocks=24, block_size=bs)
    stems = [[rng.randrange(300) for _ in range(rng.randrange(4, 20))] for _ in range(5)]
    published: set[int] = set()
    live: list[Sequence] = []
    reserved: list[list[int]] = []
    seen = {"stored": 0, "removed": 0, "most": 0}

    def take():
        stored, removed = bm.take_kv_events()
        assert not set(stored) & set(removed)
        published.difference_update(removed)
        published.update(stored)
        assert published == set(bm.hash_to_block)
        seen["stored"] += len(stored)
        seen["removed"] += len(removed)
        seen["most"] = max(seen["most"], len(published))

    for step in range(1500):
        op = rng.random()
        if op < 0.25 and len(live) < 6:  # admit a prompt that shares a stem
            stem = rng.choice(stems)[: rng.randrange(1, 21)]
            s = seq([*stem, *(rng.randrange(300) for _ in range(rng.randrange(0, 6)))], f"s{step}")
            if bm.allocate(s, rng.choice([3, 8, 100])) is not None:
                live.append(s)
        elif op < 0.55 and live:  # compute a chunk of one sequence, or decode a token
            s = rng.choice(live)
            left = s.num_tokens - s.num_computed_tokens
            if left == 0:
                s.token_ids.append(rng.randrange(300))
                left = 1
            n = min(left, rng.randrange(1, 9))
            if bm.ensure_slots(s, n):
                bm.mark_computed(s, n)
        elif op < 0.75 and live:  # finish or preempt one
            bm.free(live.pop(rng.randrange(len(live))))
        elif op < 0.82:  # disaggregation: reserve, then either fill (admitted computed) or release
            blocks = bm.reserve(rng.randrange(1, 12))
            if blocks is not None:
                reserved.append(blocks)
        elif op < 0.88 and reserved:
            blocks = reserved.pop()
            if rng.random() < 0.5:
                bm.release(blocks)
            else:
                tokens = [*rng.choice(stems), rng.randrange(300)]
                tokens = (tokens * 3)[: len(blocks) * bs - rng.randrange(bs)]
                s = seq(tokens, f"p{step}")
                s.block_table = blocks
                bm.mark_computed(s, s.num_tokens)
                live.append(s)
        elif op < 0.89:
            bm.reset_prefix_cache()
        elif op < 0.9:  # what the replica does after a Redis outage
            published = set(bm.take_kv_snapshot())
            assert published == set(bm.hash_to_block)
        if rng.random() < 0.3:
            take()
    take()
    assert seen["stored"] > 100 and seen["removed"] > 100 and seen["most"] >= 15  # the walk used the cache


def test_cached_blocks_counts_the_leading_hashes_each_replica_holds():
    hashes = prefix_hashes(list(range(200, 241)), 8)  # 5 blocks
    replicas = {9401: hashes, 9402: hashes[:2], 9403: [hashes[0], *hashes[2:]], 9404: hashes[1:], 9405: []}
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(*(kv_index_key(r) for r in replicas))
    for rid, held in replicas.items():
        if held:
            client.sadd(kv_index_key(rid), *kv_members(held))

    async def ask(hashes):
        aclient = redis.asyncio.Redis.from_url(settings.REDIS_URL, decode_responses=True)
        try:
            return await cached_blocks(aclient, list(replicas), hashes)
        finally:
            await aclient.aclose()

    try:
        # A gap stops the count: 9403 lacks the second block, 9404 the first.
        assert asyncio.run(ask(hashes)) == {9401: 5, 9402: 2, 9403: 1, 9404: 0, 9405: 0}
        assert asyncio.run(ask([])) == dict.fromkeys(replicas, 0)
    finally:
        client.delete(*(kv_index_key(r) for r in replicas))
