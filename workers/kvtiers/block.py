"""The bytes of one KV block as every tier stores it, and how a reader proves they are intact.

A payload is self-describing so that a tier never has to be trusted:

    header  28 bytes, little-endian: magic b"SYKV", format version (u32), block hash (u64),
            number of tokens (u32), data length (u64)
    tokens  the block's token ids, int32 little-endian (the reader compares them with its own:
            a hash collision must never reuse wrong KV)
    data    the block's K/V bytes, opaque here
    digest  16-byte blake2b over everything before it

A payload is stored under `block_key(fingerprint(layout), block_hash)`: the fingerprint keeps
engines whose bytes would mean something else (another model, dtype, block size, parallel rank)
from ever reading each other's blocks, though they share a store or a directory.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from array import array
from collections.abc import Sequence

from workers.kvtransfer.layout import MUST_MATCH

MAGIC = b"SYKV"
VERSION = 1
_HEADER = struct.Struct("<4sIQIQ")
DIGEST_BYTES = 16

# What two engines must agree on for a block's bytes to mean the same thing in both: the
# transfer handshake's keys, and the model (a tier is shared by replicas of many models).
LAYOUT_KEYS = ("model", *MUST_MATCH)


class CorruptBlock(Exception):
    """A payload failed verification; the reader treats it as a miss."""


def fingerprint(layout: dict) -> str:
    """16 hex chars naming a KV layout; equal fingerprints mean blocks can be shared."""
    canonical = json.dumps({k: layout.get(k) for k in LAYOUT_KEYS}, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()


def block_key(fp: str, block_hash: int) -> str:
    """The key a block is stored under: ASCII, usable as a file name and a Mooncake key."""
    return f"{fp}-{block_hash:016x}"


def _digest(view: memoryview) -> bytes:
    return hashlib.blake2b(view, digest_size=DIGEST_BYTES).digest()


def pack_block(block_hash: int, token_ids: Sequence[int], data: bytes | memoryview) -> bytes:
    tokens = array("i", token_ids)
    if sys.byteorder != "little":
        tokens.byteswap()
    data = memoryview(data).cast("B")
    header = _HEADER.pack(MAGIC, VERSION, block_hash, len(tokens), data.nbytes)
    body = b"".join((header, tokens.tobytes(), data))
    return body + _digest(memoryview(body))


def unpack_block(
    payload: bytes | memoryview, block_hash: int, checksum: bool = True
) -> tuple[tuple[int, ...], memoryview]:
    """(token ids, data) of a payload that is intact and names `block_hash`; the data is a view
    into `payload`, not a copy. Raises CorruptBlock otherwise. `checksum=False` skips the one
    costly check (blake2b over the data) for a payload a tier's get already verified."""
    view = memoryview(payload).cast("B")
    if view.nbytes < _HEADER.size + DIGEST_BYTES:
        raise CorruptBlock(f"payload of {view.nbytes} bytes is shorter than a header")
    magic, version, stored_hash, num_tokens, data_len = _HEADER.unpack_from(view)
    if magic != MAGIC:
        raise CorruptBlock(f"bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise CorruptBlock(f"format version {version}, expected {VERSION}")
    data_start = _HEADER.size + 4 * num_tokens
    if data_start + data_len + DIGEST_BYTES != view.nbytes:
        raise CorruptBlock(f"lengths ({num_tokens} tokens, {data_len} data bytes) disagree with size {view.nbytes}")
    body = view[: data_start + data_len]
    if checksum and _digest(body) != bytes(view[data_start + data_len :]):
        raise CorruptBlock("checksum mismatch")
    if stored_hash != block_hash:
        raise CorruptBlock(f"block hash {stored_hash:016x}, expected {block_hash:016x}")
    tokens = array("i")
    tokens.frombytes(view[_HEADER.size : data_start])
    if sys.byteorder != "little":
        tokens.byteswap()
    return tuple(tokens), view[data_start : data_start + data_len]
