"""The host DRAM tier: an LRU bounded by bytes, spilling what it evicts to a callback, safe to
use from several threads."""

from __future__ import annotations

import random
import threading

from tests.kvtiers.blocks import keys_and_hashes, make_block, make_blocks
from workers.kvtiers import HostTier, pack_block


def test_a_get_refreshes_recency_and_the_least_recent_block_is_spilled():
    a, b, c, d = make_blocks(4)
    spilled = []
    tier = HostTier(3 * len(a[2]), on_evict=spilled.extend)
    tier.put_many([a, b, c])
    assert tier.get_many([a[0]], [a[1]]) == [a[2]]
    tier.put_many([d])
    assert spilled == [b]
    assert tier.keys() == [c[0], a[0], d[0]]
    assert tier.exists_many([a[0], b[0]]) == [True, False]
    assert tier.stats.evictions == 1
    assert tier.stats.used_bytes == 3 * len(a[2])


def test_hits_misses_and_bytes_are_counted():
    items = make_blocks(3)
    tier = HostTier(1 << 20)
    tier.put_many(items)
    tier.put_many(items[:1])  # held already: nothing written
    keys, hashes = keys_and_hashes(items)
    got = tier.get_many([*keys, "absent"], [*hashes, 1])
    assert got == [p for _, _, p in items] + [None]
    s = tier.stats
    assert (s.hits, s.misses, s.bytes_read) == (3, 1, sum(len(p) for _, _, p in items))
    assert s.bytes_written == sum(len(p) for _, _, p in items)
    assert s.read_seconds > 0 and s.write_seconds > 0


def test_the_byte_budget_holds_under_many_random_puts():
    rng = random.Random(1)
    spilled: list = []
    cap = 40_000
    tier = HostTier(cap, on_evict=spilled.extend)
    put = {}
    for i in range(600):
        ids = [rng.randrange(300) for _ in range(rng.randrange(1, 5))]
        batch = [make_block(i, data_bytes=100 + i * 29) for i in ids]  # sizes 100 B .. 8.8 KB
        tier.put_many(batch)
        for key, _, payload in batch:
            put[key] = payload
        assert tier.stats.used_bytes <= cap, i
        held = tier.keys()
        assert tier.stats.used_bytes == sum(len(put[k]) for k in held)
    assert spilled and all(put[k] == p for k, _, p in spilled)
    assert tier.stats.evictions == len(spilled)


def test_a_payload_larger_than_the_budget_is_refused():
    big = make_block(0, data_bytes=10_000)
    tier = HostTier(5_000)
    tier.put_many([big])
    assert tier.get_many([big[0]], [big[1]]) == [None]
    assert tier.stats.used_bytes == 0 and tier.stats.errors == 0


def test_a_corrupt_payload_is_a_miss_and_is_dropped():
    key, h, _ = make_block(0)
    wrong = pack_block(h + 1, [1, 2, 3, 4], b"x" * 64)  # intact, but another block's
    tier = HostTier(1 << 20)
    tier.put_many([(key, h, wrong)])
    assert tier.get_many([key], [h]) == [None]
    assert tier.stats.checksum_failures == 1 and tier.stats.misses == 1
    assert tier.exists_many([key]) == [False] and tier.stats.used_bytes == 0


def test_several_threads_put_and_get_at_once():
    items = make_blocks(200, data_bytes=512)
    cap = 60 * len(items[0][2])
    spilled: list = []
    tier = HostTier(cap, on_evict=spilled.extend)
    errors: list = []
    gets = [0]
    lock = threading.Lock()

    def work(seed: int):
        rng = random.Random(seed)
        try:
            for _ in range(400):
                batch = rng.sample(items, 4)
                if rng.random() < 0.5:
                    tier.put_many(batch)
                else:
                    keys, hashes = keys_and_hashes(batch)
                    for (_, _, payload), got in zip(batch, tier.get_many(keys, hashes), strict=True):
                        assert got is None or got == payload
                    with lock:
                        gets[0] += len(batch)
                assert tier.stats.used_bytes <= cap
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads) and errors == []
    assert tier.stats.hits + tier.stats.misses == gets[0] and tier.stats.hits > 0
    assert tier.stats.used_bytes == sum(len(p) for k, _, p in items if k in set(tier.keys())) <= cap
    assert tier.stats.checksum_failures == tier.stats.errors == 0
