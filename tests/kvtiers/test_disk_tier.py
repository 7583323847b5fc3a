"""The disk tier: one file per block, adopted after a restart, corrupt files caught and removed,
LRU by mtime, and one byte budget that holds while several processes write the directory."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import random
import time
from pathlib import Path

from tests.kvtiers.blocks import keys_and_hashes, make_block, make_blocks
from workers.kvtiers import DiskTier, unpack_block


def block_files(path: Path) -> dict[str, int]:
    """Every file a tier wrote (blocks and temporaries), by name, with its size."""
    out = {}
    for entry in os.scandir(path):
        if entry.name != ".lock":
            try:
                out[entry.name] = entry.stat().st_size
            except FileNotFoundError:
                continue
    return out


def test_round_trip_and_counters(tmp_path):
    items = make_blocks(5)
    tier = DiskTier(tmp_path, 1 << 20)
    tier.put_many(items)
    keys, hashes = keys_and_hashes(items)
    assert tier.get_many(keys, hashes) == [p for _, _, p in items]
    assert tier.get_many(["absent"], [1]) == [None]
    assert tier.exists_many([keys[0], "absent"]) == [True, False]
    size = sum(len(p) for _, _, p in items)
    assert sorted(block_files(tmp_path)) == sorted(k + ".kvb" for k in keys)
    s = tier.stats
    assert (s.hits, s.misses, s.bytes_read, s.bytes_written, s.used_bytes) == (5, 1, size, size, size)
    tier.evict(keys[:2])
    assert tier.exists_many(keys[:3]) == [False, False, True]
    assert tier.stats.used_bytes == size - len(items[0][2]) - len(items[1][2])


def test_a_reopened_tier_adopts_the_files_and_drops_dead_writers_temporaries(tmp_path):
    items = make_blocks(4)
    first = DiskTier(tmp_path, 1 << 20)
    first.put_many(items)
    first.close()
    (tmp_path / ".somekey.999.tmp").write_bytes(b"half a block")
    second = DiskTier(tmp_path, 1 << 20)
    keys, hashes = keys_and_hashes(items)
    assert second.get_many(keys, hashes) == [p for _, _, p in items]
    assert second.stats.used_bytes == sum(len(p) for _, _, p in items)
    assert not (tmp_path / ".somekey.999.tmp").exists()


def test_reopening_with_a_smaller_budget_evicts_down_to_it(tmp_path):
    items = make_blocks(6)
    DiskTier(tmp_path, 1 << 20).put_many(items)
    small = DiskTier(tmp_path, 3 * len(items[0][2]))
    assert small.stats.used_bytes <= 3 * len(items[0][2])
    assert sum(block_files(tmp_path).values()) == small.stats.used_bytes


def test_a_corrupt_file_is_a_miss_counted_and_removed(tmp_path):
    items = make_blocks(3)
    tier = DiskTier(tmp_path, 1 << 20)
    tier.put_many(items)
    key = items[1][0]
    path = tmp_path / f"{key}.kvb"
    raw = bytearray(path.read_bytes())
    for pos in (3, 40, len(raw) // 2):  # header, token ids, data
        raw[pos] ^= 0x5A
    path.write_bytes(bytes(raw))
    keys, hashes = keys_and_hashes(items)
    got = tier.get_many(keys, hashes)
    assert got == [items[0][2], None, items[2][2]]
    assert tier.stats.checksum_failures == 1 and tier.stats.misses == 1
    assert not path.exists()
    assert tier.stats.used_bytes == len(items[0][2]) + len(items[2][2])


def test_the_least_recently_read_file_is_evicted_first(tmp_path):
    a, b, c, d = make_blocks(4)
    tier = DiskTier(tmp_path, 3 * len(a[2]))
    tier.put_many([a, b, c])
    assert tier.get_many([a[0]], [a[1]]) == [a[2]]  # a is now the most recent
    tier.put_many([d])
    assert tier.exists_many([a[0], b[0], c[0], d[0]]) == [True, False, True, True]
    assert tier.stats.evictions == 1


def test_a_read_by_another_process_counts_as_recent(tmp_path):
    """Recency lives in the files' mtimes, so a hit through another tier object (another
    replica) protects the file from this one's eviction."""
    a, b, c, d = make_blocks(4)
    writer = DiskTier(tmp_path, 3 * len(a[2]))
    writer.put_many([a, b, c])
    time.sleep(0.02)  # the reader's touch must be later than the writes on a coarse clock
    assert DiskTier(tmp_path, 3 * len(a[2])).get_many([a[0]], [a[1]]) == [a[2]]
    writer.put_many([d])
    assert writer.exists_many([a[0], b[0]]) == [True, False]


def _writer(path: str, capacity: int, seed: int, rounds: int) -> None:
    """A replica filling the shared directory: random sizes, some re-reads."""
    tier = DiskTier(path, capacity)
    rng = random.Random(seed)
    done = []
    for i in range(rounds):
        batch = [make_block(j, data_bytes=500 + (j * 7919) % 30_000, seed=seed) for j in range(i * 3, i * 3 + 3)]
        tier.put_many(batch)
        done += batch
        if rng.random() < 0.3:
            old = rng.sample(done, min(4, len(done)))
            for (_, _, payload), got in zip(old, tier.get_many(*keys_and_hashes(old)), strict=True):
                assert got is None or got == payload
        assert tier.stats.used_bytes <= capacity
    assert tier.stats.checksum_failures == 0 and tier.stats.errors == 0


def test_two_processes_share_one_budget(tmp_path):
    """The sampler takes the directory's lock (shared), so it sees the files between two
    changes: a scan without it could count a file just evicted together with its successor."""
    cap = 400_000
    DiskTier(tmp_path, cap).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), cap, seed, 120)) for seed in (1, 2)]
    for p in procs:
        p.start()
    samples = []
    fd = os.open(tmp_path / ".lock", os.O_RDWR)
    try:
        deadline = time.monotonic() + 60
        while any(p.is_alive() for p in procs):
            assert time.monotonic() < deadline, "writers did not finish in 60 s"
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                samples.append(sum(block_files(tmp_path).values()))
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            time.sleep(0.002)
    finally:
        os.close(fd)
    for p in procs:
        p.join(timeout=10)
        assert p.exitcode == 0
    assert len(samples) > 10 and max(samples) <= cap
    assert max(samples) > cap // 2  # the budget was actually under pressure
    files = block_files(tmp_path)
    assert sum(files.values()) <= cap and all(name.endswith(".kvb") for name in files)
    reader = DiskTier(tmp_path, cap)  # every surviving file is intact and the ledger agrees
    assert reader.stats.used_bytes == sum(files.values())
    for name in files:
        payload = (tmp_path / name).read_bytes()
        unpack_block(payload, int(name[: -len(".kvb")].split("-")[1], 16))


def test_a_block_larger_than_the_budget_is_not_written(tmp_path):
    big = make_block(0, data_bytes=5_000)
    tier = DiskTier(tmp_path, 4_000)
    tier.put_many([big])
    assert block_files(tmp_path) == {} and tier.stats.used_bytes == 0
