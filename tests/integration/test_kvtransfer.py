"""Mooncake Transfer Engine over TCP between two processes: the decode side's reserved blocks
end up byte-identical to the blocks the prefill side computed."""

import hashlib
import multiprocessing

import pytest

from workers.engine.config import EngineConfig
from workers.engine.llm_engine import LLMEngine
from workers.kvtransfer import layout_mismatch
from workers.kvtransfer.layout import block_bytes, block_segments, ranks_mismatch
from workers.kvtransfer.mooncake import MooncakeKV, merge_runs

pytestmark = pytest.mark.timeout(120)


def test_blocks_arrive_byte_identical(model_dir):
    from tests.support.kv_peer import prefill_and_send

    decode = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", block_size=4, num_kv_blocks=40))
    kv = MooncakeKV(decode.runner.kv_cache, decode.kv_layout())
    prompt = list(range(30, 80))  # 50 tokens: 13 blocks of 4
    decode.reserve_blocks(8)  # so that the reserved blocks are not the first ones
    blocks = decode.reserve_blocks(len(prompt))
    before = decode.runner.kv_cache[:, :, blocks].clone()
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    peer = ctx.Process(target=prefill_and_send, args=(str(model_dir), prompt, kv.endpoint(), blocks, child))
    peer.start()
    assert parent.poll(90), "the prefill process did not report"
    moved, digest = parent.recv()
    peer.join(30)
    received = decode.runner.kv_cache[:, :, blocks].contiguous()
    assert hashlib.sha256(received.numpy().tobytes()).hexdigest() == digest
    assert not received.equal(before)
    assert moved == received.numel() * received.element_size()


def test_layout_rules_and_addresses(model_dir):
    layout = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", block_size=4, num_kv_blocks=8)).kv_layout()
    assert layout_mismatch(layout, {**layout, "num_blocks": 99}) is None  # sizes may differ
    assert "head_dim" in layout_mismatch(layout, {**layout, "head_dim": 1})
    assert "model: 'a' here, 'b' there" in layout_mismatch({**layout, "model": "a"}, {**layout, "model": "b"})
    # a parallel replica's endpoint lists its ranks: the same count, each rank's layout agreeing
    ranks = [{"layout": {**layout, "tp_rank": r, "tp_size": 2}} for r in (0, 1)]
    assert ranks_mismatch({"ranks": ranks}, {"ranks": ranks}) is None and ranks_mismatch({}, {}) is None
    assert ranks_mismatch({"ranks": ranks}, {}) == "KV layouts differ (ranks: 2 here, 1 there)"
    other = [ranks[0], {"layout": {**ranks[1]["layout"], "num_layers": 1}}]
    assert ranks_mismatch({"ranks": ranks}, {"ranks": other}).startswith("rank 1: KV layouts differ (num_layers")
    size = block_bytes(layout)
    segments = block_segments(1000, layout, [2, 3])
    assert segments[:2] == [1000 + 2 * size, 1000 + 3 * size]  # layer 0, keys
    assert segments[2] == 1000 + (8 + 2) * size  # layer 0, values
    src, dst, lengths = merge_runs(segments, segments, size)
    assert lengths[0] == 2 * size and len(src) == len(dst) == 2 * layout["num_layers"]


def test_a_write_the_peer_refuses_fails_once_it_has_ended(model_dir):
    """Real failures, no fakes: blocks addressed outside the peer's registered memory, and a peer
    that is gone. The transfer reports the failure only when nothing of it is in flight."""
    import time

    from workers.kvtransfer import KVTransferError

    config = EngineConfig(model=str(model_dir), dtype="float32", block_size=4, num_kv_blocks=8)
    sender, receiver = LLMEngine(config), LLMEngine(config)
    src = MooncakeKV(sender.runner.kv_cache, sender.kv_layout())
    dst = MooncakeKV(receiver.runner.kv_cache, receiver.kv_layout())
    outside = {**dst.endpoint(), "base": dst.endpoint()["base"] + receiver.runner.kv_cache.nbytes}
    transfer = src.start_write(outside, [0, 1], [0, 1])
    deadline = time.monotonic() + 20
    with pytest.raises(KVTransferError, match=f"write to {dst.session} failed"):
        while not transfer.poll():
            assert time.monotonic() < deadline
            time.sleep(0.001)
    assert not transfer.pending

    gone = {**dst.endpoint(), "session": "127.0.0.1:1"}  # nothing listens on port 1
    with pytest.raises(KVTransferError, match="could not start a write to 127.0.0.1:1"):
        src.start_write(gone, [0], [0]).poll()


@pytest.fixture(scope="module")
def mla_dir(tmp_path_factory):
    from tests.engine.checkpoints import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("mla"), "kimi_k2")


def test_latent_blocks_arrive_byte_identical(mla_dir):
    """MLA blocks (one latent + rope key per token, one part per layer) between two processes."""
    from tests.support.kv_peer import prefill_and_send

    decode = LLMEngine(EngineConfig(model=str(mla_dir), dtype="float32", block_size=4, num_kv_blocks=40))
    layout = decode.kv_layout()
    assert (layout["kv_layout"], layout["kv_parts"]) == ("mla", 1)
    kv = MooncakeKV(decode.runner.kv_cache, layout)
    prompt = list(range(30, 70))
    decode.reserve_blocks(8)
    blocks = decode.reserve_blocks(len(prompt))
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    peer = ctx.Process(target=prefill_and_send, args=(str(mla_dir), prompt, kv.endpoint(), blocks, child))
    peer.start()
    assert parent.poll(90), "the prefill process did not report"
    moved, digest = parent.recv()
    peer.join(30)
    received = decode.runner.kv_cache[:, :, blocks].contiguous()
    assert hashlib.sha256(received.numpy().tobytes()).hexdigest() == digest
    assert received.abs().sum() > 0
    assert moved == received.numel() * received.element_size() == 3 * len(blocks) * 4 * 48 * 4


def test_dense_and_latent_caches_never_exchange_blocks(model_dir, mla_dir):
    dense = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", block_size=4, num_kv_blocks=8)).kv_layout()
    mla = LLMEngine(EngineConfig(model=str(mla_dir), dtype="float32", block_size=4, num_kv_blocks=8)).kv_layout()
    problem = layout_mismatch(dense, mla)
    assert "kv_layout: 'dense' here, 'mla' there" in problem and "kv_parts: 2 here, 1 there" in problem
    # Same architecture, a cache of another layout (an engine that cached keys and values): refused.
    assert "kv_layout" in layout_mismatch(mla, {**mla, "kv_layout": "dense"})
    size = block_bytes(mla)
    assert size == 4 * 1 * 48 * 4  # block_size × heads × (latent + rope key) × fp32
    assert block_segments(0, mla, [2, 5]) == [2 * size, 5 * size, (8 + 2) * size, (8 + 5) * size, 18 * size, 21 * size]
