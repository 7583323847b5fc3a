"""Which KV blocks a replica holds, published for prefix-aware routing.

Both ends compute the same block hash: the replica's engine names every full KV block by
`chain_hash` (its tokens chained to the previous block's hash), and a router hashes a prompt's
token ids the same way (`prefix_hashes`) to ask which replica already holds the longest prefix
of it (`cached_blocks`). Pure Python, no torch, numpy or Django: the web process imports it.

The contract, per replica, in the Redis SET `kv_index_key(replica_id)`
(`switchyard:replica:<id>:kv`):

- Members are the hashes, as decimal strings (`kv_members`), of every block the replica's
  prefix cache can serve right now: blocks in use and freed blocks not yet evicted (the engine's
  `BlockManager.hash_to_block`). Empty when the replica runs without prefix caching.
- The replica is its one writer. After each engine step it adds the hashes that joined its
  cache and removes the ones evicted (one pipelined write, no extra round trip), so the set
  trails the engine by at most one step: eventually consistent, and a router's answer is a
  prediction that the engine's own verified lookup confirms or not (a miss costs a prefill,
  never a wrong answer).
- Cleared when an incarnation starts (a new process has an empty cache), when it stops cleanly,
  and by its node agent when the process exits any other way. After Redis was unreachable the
  replica rewrites the whole set from its cache instead of replaying deltas that may be lost.
- Every role publishes, prefill replicas included: the set says what a replica's cache holds;
  which role's sets matter is the router's choice.
- A router reads the block size from `ReplicaStatus.kv_block_size` (0: not reported, so there
  is nothing to compare) and should only trust replicas whose status is fresh and ready.

Why a Redis set rather than a stream of stored/removed events folded into an index inside the
gateway: every web process reads the same set, a gateway restart needs no snapshot or replay to
catch up, and membership of a prompt's prefix in N replicas is one pipelined round trip.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis.asyncio

_PREV = struct.Struct("<Q")


def chain_hash(prev: int | None, token_ids: Iterable[int]) -> int:
    """A block's hash: blake2b-8 of the previous block's hash (0 for the first block) as 8
    little-endian bytes, then the block's token ids as little-endian int64s; the digest read
    little-endian. Stable across processes and machines (unlike `hash()`), so replicas and
    routers agree on it."""
    h = hashlib.blake2b(_PREV.pack(prev or 0), digest_size=8)
    ids = array("q", token_ids)
    if sys.byteorder != "little":
        ids.byteswap()
    h.update(ids.tobytes())
    return int.from_bytes(h.digest(), "little")


def prefix_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """The chained hashes of the prompt's leading full blocks that an engine could serve from
    its cache: the first `(len(token_ids) - 1) // block_size`. The engine always computes at
    least the prompt's last token (its logits start generation), so a full last block is never
    reused; leaving it out makes `cached_blocks(...) * block_size` predict the `cached_tokens`
    the engine will report."""
    out: list[int] = []
    prev = None
    for i in range((len(token_ids) - 1) // block_size):
        prev = chain_hash(prev, token_ids[i * block_size : (i + 1) * block_size])
        out.append(prev)
    return out


def kv_index_key(replica_id: int) -> str:
    return f"switchyard:replica:{replica_id}:kv"


def kv_members(hashes: Iterable[int]) -> list[str]:
    """How hashes are written into and looked up in the set."""
    return [str(h) for h in hashes]


async def cached_blocks(client: redis.asyncio.Redis, replica_ids: list[int], hashes: list[int]) -> dict[int, int]:
    """For each replica, how many of `hashes` (a prompt's `prefix_hashes`) it holds from the
    start: the length of its cached prefix in blocks. A block missing stops the count, since
    the engine reuses only a contiguous prefix. One round trip for all replicas."""
    if not hashes or not replica_ids:
        return dict.fromkeys(replica_ids, 0)
    members = kv_members(hashes)
    async with client.pipeline(transaction=False) as pipe:
        for rid in replica_ids:
            pipe.smismember(kv_index_key(rid), members)
        replies = await pipe.execute()
    out = {}
    for rid, present in zip(replica_ids, replies, strict=True):
        n = 0
        for hit in present:
            if not int(hit):
                break
            n += 1
        out[rid] = n
    return out
