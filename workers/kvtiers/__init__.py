"""Storage tiers for KV-cache blocks evicted from the device cache, so that a prompt prefix can be
loaded instead of recomputed.

- `HostTier` ("dram"): per replica, an LRU of payloads in process memory bounded by bytes; what
  it pushes out is handed to a callback (the engine spills it to disk).
- `MooncakeStoreTier` ("store"): a pool shared by every replica of a deployment and across
  nodes, each replica contributing memory to it; `mooncake_master` (`master`) indexes it.
- `DiskTier` ("disk"): per node, one file per block in a directory the node's replicas share,
  under one byte budget.

Every tier stores the same payload (`block`): a header naming the block hash, the block's token
ids, its K/V bytes and a blake2b checksum, under a key made of the KV layout's fingerprint and
the block hash. Every read is verified: a payload that fails (flipped bytes on disk or in the
store, a torn write, another block's bytes) is a miss, counted in `checksum_failures` and removed
from the tier, never returned. Tiers are caches: they may lose any block, never raise to their
caller on a backend failure, and are safe to call from several threads.
"""

from workers.kvtiers.base import KVTier, TierStats
from workers.kvtiers.block import CorruptBlock, block_key, fingerprint, pack_block, unpack_block
from workers.kvtiers.disk import DiskTier
from workers.kvtiers.host import HostTier
from workers.kvtiers.store import MooncakeStoreTier

__all__ = [
    "CorruptBlock",
    "DiskTier",
    "HostTier",
    "KVTier",
    "MooncakeStoreTier",
    "TierStats",
    "block_key",
    "fingerprint",
    "pack_block",
    "unpack_block",
]
