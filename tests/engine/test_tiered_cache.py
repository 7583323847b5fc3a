"""KV tiers behind the engine's device cache (workers/engine/tiered_cache.py): a prefix that
comes back from host DRAM, the Mooncake Store or disk gives exactly the answer the device cache
gives, and the same tokens as recomputing it; broken and unreachable tiers cost a recompute,
never a wrong answer or a stall."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.freeze import freeze
from workers.engine import LLM, SamplingParams
from workers.engine.errors import RequestError
from workers.engine.tiered_cache import KVTierConfig

BLOCK = 4
PROMPT = [(7 * i + 3) % 300 + 1 for i in range(61)]  # 15 full blocks can be served from a cache
FILLERS = [[(11 * i + k) % 300 + 1 for i in range(61)] for k in (1, 2)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, logprobs=2, ignore_eos=True)


def engine(model_dir, **kwargs) -> LLM:
    # 24 blocks hold one request at a time: two fillers evict every block of PROMPT.
    return LLM(str(model_dir), dtype="float32", block_size=BLOCK, num_kv_blocks=24, **kwargs)


def answer(llm: LLM, prompt=PROMPT):
    out = llm.generate({"prompt_token_ids": prompt}, PARAMS)[0]
    comp = out.outputs[0]
    return comp.token_ids, comp.logprobs, out.num_cached_tokens


def evict_all(llm: LLM) -> None:
    for filler in FILLERS:
        answer(llm, filler)
    assert not any(h in llm.engine.block_manager.hash_to_block for h in prefix_hashes())


def prefix_hashes():
    from workers.protocol.kv_blocks import prefix_hashes as hashes

    return hashes(PROMPT, BLOCK)


@pytest.fixture(scope="module")
def recomputed(llama_dir):
    llm = LLM(str(llama_dir), dtype="float32", block_size=BLOCK, enable_prefix_caching=False)
    return answer(llm)


def assert_same(got, recomputed, device_hit):
    tokens, logprobs, _ = got
    assert tokens == recomputed[0]
    for mine, ref in zip(logprobs, recomputed[1], strict=True):
        assert mine.keys() == ref.keys()
        assert max(abs(mine[t] - ref[t]) for t in mine) < 1e-4
    assert (tokens, logprobs) == device_hit[:2]  # the very bytes the device cache held


def test_dram_tier_serves_an_evicted_prefix(llama_dir, recomputed):
    llm = engine(llama_dir, kv_tiers={"dram_bytes": 4 << 20})
    answer(llm)
    device_hit = answer(llm)  # every full prompt block from the device cache
    assert device_hit[2] == 60
    evict_all(llm)
    got = answer(llm)
    assert got[2] == 60  # all 15 blocks came back from DRAM
    stats = llm.engine.tier_stats()
    assert stats["blocks_loaded"]["dram"] == 15
    assert stats["tiers"]["dram"]["used_bytes"] <= 4 << 20
    assert_same(got, recomputed, device_hit)


def test_disk_tier_survives_an_engine_restart(llama_dir, recomputed, tmp_path):
    tiers = {"disk_path": str(tmp_path / "kv"), "disk_bytes": 8 << 20}
    llm = engine(llama_dir, kv_tiers=tiers)
    answer(llm)
    device_hit = answer(llm)
    evict_all(llm)  # without DRAM, evicted blocks go straight to disk
    assert llm.engine.tiers.flush()
    got = answer(llm)
    assert got[2] == 60 and llm.engine.tier_stats()["blocks_loaded"]["disk"] == 15
    assert_same(got, recomputed, device_hit)
    llm.engine.close()

    restarted = engine(llama_dir, kv_tiers=tiers)  # a new process's engine finds them on disk
    got = answer(restarted)
    assert got[2] == 60 and restarted.engine.tier_stats()["blocks_loaded"]["disk"] == 15
    assert_same(got, recomputed, device_hit)
    restarted.engine.close()


def test_dram_spills_to_disk_and_budgets_hold(llama_dir, recomputed, tmp_path):
    block_payload = 2 * 2 * BLOCK * 2 * 16 * 4 + 200  # K/V bytes of one block, plus header
    tiers = {"dram_bytes": 6 * block_payload, "disk_path": str(tmp_path / "kv"), "disk_bytes": 40 * block_payload}
    llm = engine(llama_dir, kv_tiers=tiers)
    answer(llm)
    device_hit = answer(llm)
    evict_all(llm)
    assert llm.engine.tiers.flush()
    got = answer(llm)
    stats = llm.engine.tier_stats()
    assert got[2] == 60
    assert stats["blocks_loaded"]["dram"] + stats["blocks_loaded"]["disk"] == 15
    assert stats["blocks_loaded"]["disk"] > 0  # DRAM could not hold them all
    assert_same(got, recomputed, device_hit)
    assert stats["tiers"]["dram"]["used_bytes"] <= tiers["dram_bytes"]
    on_disk = sum(f.stat().st_size for f in (tmp_path / "kv").rglob("*.kvb"))
    assert on_disk <= tiers["disk_bytes"]
    llm.engine.close()


def test_a_corrupted_block_on_disk_is_detected_and_recomputed(llama_dir, recomputed, tmp_path):
    tiers = {"disk_path": str(tmp_path / "kv"), "disk_bytes": 8 << 20}
    llm = engine(llama_dir, kv_tiers=tiers)
    answer(llm)
    evict_all(llm)
    assert llm.engine.tiers.flush()
    files = sorted((tmp_path / "kv").rglob("*.kvb"))
    assert files
    for f in files:  # flip one byte of K/V data in every block
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    got = answer(llm)
    stats = llm.engine.tier_stats()
    assert stats["tiers"]["disk"]["checksum_failures"] >= 1
    assert stats["blocks_loaded"]["disk"] == 0
    assert got[2] == 0  # nothing reused: the whole prompt was computed again
    assert got[0] == recomputed[0]
    llm.engine.close()


def test_tier_config_is_checked():
    with pytest.raises(RequestError, match="unknown keys"):
        KVTierConfig.from_dict({"dram": 5})
    with pytest.raises(RequestError, match="disk_path and disk_bytes"):
        KVTierConfig.from_dict({"disk_bytes": 100})
    with pytest.raises(RequestError, match="non-negative"):
        KVTierConfig.from_dict({"dram_bytes": -1})
    assert KVTierConfig.from_dict({}) is None


# -- the Mooncake Store, shared by engines in separate processes ---------------------------------
WRITER = """
import json, sys, time
from workers.engine import LLM, SamplingParams
model, tiers, prompt = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
llm = LLM(model, dtype="float32", block_size=4, num_kv_blocks=24, kv_tiers=tiers)
# The store client connects in the background, and a turn that ends before it does is not shared.
deadline = time.monotonic() + 30
while not llm.engine.tiers.store.stats.available:
    assert time.monotonic() < deadline, "the store client never connected"
    time.sleep(0.05)
llm.engine.add_request("turn", prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
                       session_turn=True)
while llm.engine.has_unfinished_requests():
    llm.engine.step()
assert llm.engine.tiers.flush(), "the store writes did not finish"
print(json.dumps(llm.engine.tier_stats()["tiers"]["store"]))
llm.engine.close()
"""


@pytest.fixture
def master():
    """A master and a segment server holding the pool, as `make run` starts them: engines
    contribute no memory, so blocks outlive the engine that put them."""
    from workers.kvtiers.master import free_port, start_master, start_segment_server, stop_master

    port, metrics = free_port(), free_port()
    proc = start_master(port, metrics)
    pool = start_segment_server(f"127.0.0.1:{port}", 64 << 20, free_port())
    yield f"127.0.0.1:{port}", proc, f"127.0.0.1:{metrics}"
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)  # in case a test left it stopped
    stop_master(pool)
    stop_master(proc)


def connected(llm: LLM) -> None:
    deadline = time.monotonic() + 30
    while not llm.engine.tiers.store.stats.available:  # it connects in the background
        assert time.monotonic() < deadline, "the store client never connected"
        time.sleep(0.05)


def test_store_shares_a_session_turn_between_processes(llama_dir, recomputed, master):
    address, _, metrics = master
    tiers = {"store_master": address, "store_segment_bytes": 0, "store_buffer_bytes": 16 << 20}
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", WRITER, str(llama_dir), json.dumps(tiers), json.dumps(PROMPT)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["bytes_written"] > 0

    llm = engine(llama_dir, kv_tiers={**tiers, "store_metrics": metrics})
    connected(llm)
    got = answer(llm)
    assert got[2] == 60  # the other process's turn, every full block
    assert llm.engine.tier_stats()["blocks_loaded"]["store"] == 15
    device_hit = answer(llm)
    assert_same(got, recomputed, device_hit)
    # The pool's capacity, from the master's metrics (read every few seconds while connected).
    deadline = time.monotonic() + 15
    while llm.engine.tier_stats()["tiers"]["store"]["capacity_bytes"] < 64 << 20:
        assert time.monotonic() < deadline, "the store never reported the pool's capacity"
        time.sleep(0.1)
    llm.engine.close()


def session_turn(llm: LLM, name: str) -> int:
    """Bytes the store tier wrote for one more session turn of PROMPT."""
    eng, store = llm.engine, llm.engine.tiers.store
    before = store.stats.bytes_written
    eng.add_request(name, PROMPT, PARAMS, session_turn=True)
    while eng.has_unfinished_requests():
        eng.step()
    assert eng.tiers.flush(), "the store writes did not finish"
    return store.stats.bytes_written - before


def pool_bytes(metrics: str) -> int:
    """The pool's capacity, from the master's metrics (0 while they do not answer)."""
    from workers.kvtiers.store import read_pool_metrics

    try:
        return read_pool_metrics(metrics, 5).get("master_total_capacity_bytes", 0)
    except OSError:
        return 0


def test_a_put_the_store_refused_is_tried_again(llama_dir):
    """A master with no pool yet refuses every put (it answers: no reconnection, no new epoch);
    once a segment server lends memory, the next turn puts the blocks the refused put held."""
    from workers.kvtiers.master import free_port, start_master, start_segment_server, stop_master

    port = free_port()
    address = f"127.0.0.1:{port}"
    procs = [start_master(port, free_port())]
    llm = None
    try:
        llm = engine(llama_dir, kv_tiers={"store_master": address, "store_segment_bytes": 0, "timeout_s": 5.0})
        connected(llm)
        store = llm.engine.tiers.store
        epoch, errors = store.epoch, store.stats.errors
        assert session_turn(llm, "no pool") == 0
        assert store.stats.errors > errors and store.stats.available
        procs.append(start_segment_server(address, 64 << 20, free_port()))
        assert session_turn(llm, "a pool") > 0
        assert session_turn(llm, "put already") == 0
        assert store.epoch == epoch  # put again because it had failed, not because of a reconnection
    finally:
        if llm is not None:
            llm.engine.close()
        for proc in reversed(procs):
            stop_master(proc)


def test_a_turn_the_store_lost_is_put_again(llama_dir, recomputed, master):
    """A turn that finished while the master hung copied nothing out; the one after it
    reconnected puts the blocks. A master restarted with an empty pool, which no call may see
    fail, is noticed by the tier's marker: the next turn puts the blocks again."""
    from workers.kvtiers.master import start_master, stop_master

    address, proc, metrics = master
    tiers = {"store_master": address, "store_segment_bytes": 0, "timeout_s": 1.0}
    llm = engine(llama_dir, kv_tiers=tiers)
    store = llm.engine.tiers.store
    new_master = reader = None

    def next_epoch(epoch: int) -> None:
        deadline = time.monotonic() + 30
        while not (store.stats.available and store.epoch > epoch):
            assert time.monotonic() < deadline, "the store tier never saw the master come back"
            time.sleep(0.05)

    try:
        connected(llm)
        epoch = store.epoch
        try:
            freeze(proc.pid)
            assert session_turn(llm, "hung") == 0 and not store.stats.available
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        next_epoch(epoch)
        assert session_turn(llm, "after the outage") > 0
        assert session_turn(llm, "put already") == 0

        epoch = store.epoch
        stop_master(proc)
        port, metrics_port = int(address.rpartition(":")[2]), int(metrics.rpartition(":")[2])
        new_master = start_master(port, metrics_port)
        next_epoch(epoch)
        deadline = time.monotonic() + 30
        while pool_bytes(metrics) < 64 << 20:  # the fixture's segment server rejoins it
            assert time.monotonic() < deadline, "the segment server never rejoined the new master"
            time.sleep(0.1)
        assert session_turn(llm, "after the restart") > 0
        reader = engine(llama_dir, kv_tiers={**tiers, "timeout_s": 5.0})
        connected(reader)
        got = answer(reader)
        assert reader.engine.tier_stats()["blocks_loaded"]["store"] == 15
        assert got[0] == recomputed[0]
    finally:
        for one in (reader, llm):
            if one is not None:
                one.engine.close()
        if new_master is not None:
            stop_master(new_master)


def test_an_unreachable_store_costs_nothing_but_the_hits(llama_dir, recomputed):
    from workers.kvtiers.master import free_port

    tiers = {"store_master": f"127.0.0.1:{free_port()}", "timeout_s": 0.5}  # nobody listens
    llm = engine(llama_dir, kv_tiers=tiers)
    started = time.monotonic()
    got = answer(llm)
    assert time.monotonic() - started < 10
    assert got[0] == recomputed[0]
    assert llm.engine.tier_stats()["tiers"]["store"]["available"] is False
    llm.engine.close()


def test_a_hung_store_never_stalls_the_running_batch(llama_dir, recomputed, master):
    """The master frozen (SIGSTOP, as a hung host would be): a new request's lookup waits on a
    loader thread, up to the tier timeout, while the running request keeps decoding."""
    address, proc, _ = master
    llm = engine(llama_dir, kv_tiers={"store_master": address, "store_segment_bytes": 0, "timeout_s": 1.0})
    connected(llm)
    eng = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    running = eng.add_request("running", [5, 6, 7], params)
    while running.num_output_tokens == 0:
        eng.step()
    try:
        freeze(proc.pid)  # stopped for real before the lookup is sent
        waiting = eng.add_request("waiting", PROMPT, PARAMS)
        eng.step()  # starts the lookup on a loader thread
        stats = eng.tier_stats()
        assert waiting.status.value == "waiting" and stats["loads_inflight"] == 1, (
            f"the lookup did not wait on the stopped master: {waiting.status.value}, {stats}"
        )
        tokens_while_loading = 0
        started = time.monotonic()
        while waiting.status.value == "waiting":
            before = running.num_output_tokens
            eng.step()
            if waiting.status.value == "waiting":
                tokens_while_loading += running.num_output_tokens - before
            assert time.monotonic() - started < 10, "the lookup outlived the tier timeout"
        assert tokens_while_loading >= 5  # the batch stepped while the store did not answer
        assert eng.tier_stats()["tiers"]["store"]["available"] is False
        while eng.has_unfinished_requests():
            eng.step()
        assert waiting.output_token_ids == recomputed[0]
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    llm.engine.close()
