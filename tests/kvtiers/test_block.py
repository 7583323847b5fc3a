"""The block payload format (workers/kvtiers/block.py): what a tier stores and how a reader
proves it intact. Any single flipped byte, wherever it falls, must be caught."""

from __future__ import annotations

import pytest

from workers.kvtiers import CorruptBlock, block_key, fingerprint, pack_block, unpack_block

LAYOUT = {
    "model": "m",
    "architecture": "LlamaForCausalLM",
    "dtype": "bfloat16",
    "block_size": 16,
    "num_layers": 2,
    "num_kv_heads": 2,
    "head_dim": 8,
    "tp_rank": 0,
    "tp_size": 1,
}


def test_round_trip_returns_tokens_and_a_view_of_the_data():
    data = bytes(range(256)) * 4
    payload = pack_block(0xDEADBEEF12345678, [1, 2, 31_999, 2**31 - 1], data)
    tokens, view = unpack_block(payload, 0xDEADBEEF12345678)
    assert tokens == (1, 2, 31_999, 2**31 - 1)
    assert bytes(view) == data
    assert view.obj is payload  # not a copy


def test_empty_block_round_trips():
    tokens, view = unpack_block(pack_block(7, [], b""), 7)
    assert tokens == () and view.nbytes == 0


def test_every_single_byte_flip_is_detected():
    """Header, token ids, data and checksum: every position, two different flips each."""
    payload = pack_block(2**64 - 1, [5, 6, 7, 8], bytes(range(64)))
    assert len(payload) == 28 + 16 + 64 + 16
    for pos in range(len(payload)):
        for mask in (0x01, 0xFF):
            bad = bytearray(payload)
            bad[pos] ^= mask
            with pytest.raises(CorruptBlock):
                unpack_block(bytes(bad), 2**64 - 1)


def test_wrong_hash_truncation_and_trailing_bytes_are_corrupt():
    payload = pack_block(42, [1, 2], b"kv")
    for bad, h in ((payload, 43), (payload[:-1], 42), (payload + b"\0", 42), (b"", 42), (b"SYKV", 42)):
        with pytest.raises(CorruptBlock):
            unpack_block(bad, h)


def test_fingerprint_covers_the_layout_and_nothing_else():
    fp = fingerprint(LAYOUT)
    assert len(fp) == 16 and int(fp, 16) >= 0
    assert fingerprint(dict(reversed(LAYOUT.items())) | {"num_blocks": 123}) == fp
    for key in LAYOUT:
        assert fingerprint(LAYOUT | {key: "other"}) != fp, key
    missing = {k: v for k, v in LAYOUT.items() if k != "tp_size"}
    assert fingerprint(missing) == fingerprint(missing | {"tp_size": None}) != fp


def test_block_key_is_ascii_and_fixed_width():
    key = block_key("0123456789abcdef", 255)
    assert key == "0123456789abcdef-00000000000000ff"
    assert block_key("0123456789abcdef", 2**64 - 1).isascii()
