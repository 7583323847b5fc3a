"""The Mooncake Store tier against a real `mooncake_master` (started by start_master on free
ports): round trip, sharing between processes, corrupt payloads caught, and a master that hangs,
dies and returns while callers never wait longer than the tier's timeout."""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.kvtiers.blocks import keys_and_hashes, make_block, make_blocks
from tests.support.freeze import freeze
from tests.support.stack import wait_for
from workers.kvtiers import MooncakeStoreTier, pack_block
from workers.kvtiers.master import free_port, start_master, start_segment_server, stop_master

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def master_ports(tmp_path_factory):
    port, metrics = free_port(), free_port()
    proc = start_master(port, metrics, log_path=tmp_path_factory.mktemp("master") / "master.log")
    yield port, metrics
    stop_master(proc)


@pytest.fixture(scope="module")
def master(master_ports):
    return f"127.0.0.1:{master_ports[0]}"


@pytest.fixture(scope="module")
def tier(master, master_ports):
    """Reports the pool's use from the master's metrics endpoint."""
    tier = MooncakeStoreTier(
        master,
        segment_bytes=64 << 20,
        buffer_bytes=32 << 20,
        reconnect_s=0.2,
        metrics_address=f"127.0.0.1:{master_ports[1]}",
    )
    wait_for(lambda: tier.stats.available, 20, "the store tier to connect")
    yield tier
    tier.close()


def connected(tier: MooncakeStoreTier) -> MooncakeStoreTier:
    wait_for(lambda: tier.stats.available, 30, "the store tier to connect")
    return tier


def test_round_trip(tier):
    items = make_blocks(8, data_bytes=64 << 10, seed=10)
    before = tier.stats.as_dict()
    tier.put_many(items)
    keys, hashes = keys_and_hashes(items)
    assert tier.exists_many([*keys, "absent"]) == [True] * 8 + [False]
    assert tier.get_many([*keys, "absent"], [*hashes, 1]) == [p for _, _, p in items] + [None]
    after = tier.stats
    assert after.hits - before["hits"] == 8 and after.misses - before["misses"] == 1
    assert after.bytes_written - before["bytes_written"] == sum(len(p) for _, _, p in items)
    assert after.errors == before["errors"]

    tier.put_many(items[:2] + make_blocks(1, data_bytes=1024, seed=11))  # held ones are skipped
    assert after.errors == before["errors"]
    tier.evict(keys[:2])
    assert tier.exists_many(keys[:3]) == [False, False, True]


def test_the_pool_use_comes_from_the_master(tier):
    tier.put_many(make_blocks(4, data_bytes=64 << 10, seed=12))
    wait_for(lambda: tier.stats.used_bytes >= 4 * (64 << 10), 10, "the master to report the pool's use")
    assert tier.stats.capacity_bytes >= 64 << 20  # the pool: every client's segment


def test_a_corrupt_payload_is_a_miss_counted_and_removed(tier):
    key, h, payload = make_block(0, data_bytes=4096, seed=20)
    bad = bytearray(payload)
    bad[100] ^= 0xFF
    wrong_block = pack_block(h ^ 1, [1, 2, 3, 4], b"x" * 64)  # intact, but another block's
    other_key, other_h, _ = make_block(1, seed=20)
    before = tier.stats.checksum_failures
    tier.put_many([(key, h, bytes(bad)), (other_key, other_h, wrong_block)])  # put stores bytes as given
    assert tier.get_many([key, other_key], [h, other_h]) == [None, None]
    assert tier.stats.checksum_failures == before + 2
    assert tier.exists_many([key, other_key]) == [False, False]


def test_two_processes_share_blocks(tier, master):
    key, h, payload = make_block(0, data_bytes=64 << 10, seed=30)
    tier.put_many([(key, h, payload)])
    peer = subprocess.Popen(
        [sys.executable, "-m", "tests.kvtiers.store_peer", master, key, str(h), "31"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert peer.stdout.readline().split() == ["got", hashlib.sha256(payload).hexdigest()]
        _, peer_key, peer_errors = peer.stdout.readline().split()
        assert peer_errors == "0"
        theirs = make_block(0, data_bytes=64 << 10, seed=31)
        assert peer_key == theirs[0]
        assert tier.get_many([theirs[0]], [theirs[1]]) == [theirs[2]]
        peer.stdin.write("done\n")
        peer.stdin.flush()
        assert peer.wait(timeout=30) == 0
    finally:
        if peer.poll() is None:
            peer.kill()


def test_blocks_outlive_their_writer_in_a_segment_server(tmp_path):
    """Replicas that contribute no memory put into a node's segment server: a writer that exits
    leaves its blocks readable (a writer's own segment would take them along)."""
    port = free_port()
    master = start_master(port, free_port(), log_path=tmp_path / "master.log")
    holder = start_segment_server(f"127.0.0.1:{port}", 16 << 20, free_port(), log_path=tmp_path / "holder.log")
    reader = None
    try:
        peer = subprocess.Popen(
            [sys.executable, "-m", "tests.kvtiers.store_peer", f"127.0.0.1:{port}", "absent", "1", "60", "0"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        out, _ = peer.communicate("done\n", timeout=60)
        assert peer.returncode == 0 and out.split()[:2] == ["got", "none"]
        assert out.split()[-1] == "0"  # no errors putting
        written = make_block(0, data_bytes=64 << 10, seed=60)
        reader = connected(MooncakeStoreTier(f"127.0.0.1:{port}", segment_bytes=0, buffer_bytes=16 << 20))
        assert reader.get_many([written[0]], [written[1]]) == [written[2]]
    finally:
        if reader is not None:
            reader.close()
        stop_master(holder)
        stop_master(master)


def _timed(fn, *args) -> float:
    started = time.monotonic()
    fn(*args)
    return time.monotonic() - started


def test_master_hung_then_dead_then_back(tmp_path, caplog):
    """SIGSTOP: calls hang in Mooncake (30 s), the tier answers within its timeout. SIGKILL and a
    new master on the same port: the tier notices, then reconnects. One warning per outage."""
    caplog.set_level(logging.INFO, logger="workers.kvtiers.store")
    port = free_port()
    metrics = free_port()
    proc = start_master(port, metrics, log_path=tmp_path / "master.log")
    timeout = 0.5
    tier = connected(
        MooncakeStoreTier(
            f"127.0.0.1:{port}", segment_bytes=32 << 20, buffer_bytes=16 << 20, timeout_s=timeout, reconnect_s=0.2
        )
    )
    items = make_blocks(4, data_bytes=64 << 10, seed=40)
    keys, hashes = keys_and_hashes(items)
    try:
        tier.put_many(items)
        assert tier.get_many(keys, hashes) == [p for _, _, p in items]
        assert (tier.stats.capacity_bytes, tier.stats.used_bytes) == (32 << 20, 0)  # no metrics address

        def warnings():  # the outage warnings (a put refused for want of room right after is another matter)
            return [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "workers.kvtiers.store"]

        freeze(proc.pid)
        # A put needs the master (a get of blocks just read may not: the client can remember
        # where they are, and was seen to serve them from a stopped master).
        assert _timed(tier.put_many, make_blocks(2, seed=44)) < timeout + 1.0
        assert not tier.stats.available
        for _ in range(5):  # unavailable: answered at once, all misses, puts dropped
            assert _timed(tier.put_many, make_blocks(2, seed=41)) < timeout / 2
            assert _timed(tier.get_many, keys, hashes) < timeout / 2
        assert tier.get_many(keys, hashes) == [None] * 4
        assert len(warnings()) == 1
        errors = tier.stats.errors

        os.kill(proc.pid, signal.SIGCONT)
        wait_for(lambda: tier.stats.available, 30, "the tier to notice the master is back")
        assert tier.get_many(keys, hashes) == [p for _, _, p in items]
        assert any("reconnected" in r.getMessage() for r in caplog.records)

        proc.kill()
        proc.wait()
        assert _timed(tier.put_many, make_blocks(2, seed=42)) < timeout + 1.0
        assert _timed(tier.get_many, keys, hashes) < timeout + 1.0
        wait_for(lambda: not tier.stats.available, 5, "the tier to notice the master is gone")
        assert len(warnings()) == 2 and tier.stats.errors > errors

        proc = start_master(port, metrics, log_path=tmp_path / "master.log")
        fresh = make_blocks(3, data_bytes=64 << 10, seed=43)

        def serves() -> bool:
            tier.put_many(fresh)
            return tier.get_many(*keys_and_hashes(fresh)) == [p for _, _, p in fresh]

        wait_for(serves, 30, "the tier to serve from the restarted master", interval=0.2)
        assert len(warnings()) == 2
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        tier.close()
        stop_master(proc)


def test_a_tier_started_before_its_master_connects_when_it_comes(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="workers.kvtiers.store")
    port = free_port()
    tier = MooncakeStoreTier(f"127.0.0.1:{port}", segment_bytes=16 << 20, buffer_bytes=16 << 20, reconnect_s=0.2)
    proc = None
    try:
        item = make_block(0, seed=50)
        assert _timed(tier.put_many, [item]) < 0.5
        assert tier.get_many([item[0]], [item[1]]) == [None]
        assert not tier.stats.available and tier.stats.errors == 2  # the put and the get
        wait_for(lambda: [r for r in caplog.records if r.levelno == logging.WARNING], 15, "the warning")
        # Its retries never stop this thread (Mooncake's setup holds the GIL while it waits).
        started = time.monotonic()
        for _ in range(10):
            time.sleep(0.1)
        assert time.monotonic() - started < 1.5
        proc = start_master(port, free_port(), log_path=tmp_path / "master.log")
        wait_for(lambda: tier.stats.available, 30, "the tier to connect")
        tier.put_many([item])
        assert tier.get_many([item[0]], [item[1]]) == [item[2]]
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    finally:
        tier.close()
        if proc is not None:
            stop_master(proc)
