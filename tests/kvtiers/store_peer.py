"""Another replica's store client, in its own process: `python -m tests.kvtiers.store_peer
<master> <key> <hash> <seed> [<segment bytes>]` reads the block the parent put under `key`,
prints the sha256 of what it got ("none" for a miss), puts block `seed` of its own and prints its
key, then holds its segment (where the store may have placed that block) until a line arrives on
stdin."""

from __future__ import annotations

import hashlib
import sys
import time

from tests.kvtiers.blocks import make_block
from workers.kvtiers import MooncakeStoreTier


def main() -> None:
    master, key, block_hash, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    segment = int(sys.argv[5]) if len(sys.argv) > 5 else 32 << 20
    tier = MooncakeStoreTier(master, segment_bytes=segment, buffer_bytes=16 << 20)
    deadline = time.monotonic() + 20
    while not tier.stats.available:
        assert time.monotonic() < deadline, "the store did not connect in 20 s"
        time.sleep(0.02)
    [got] = tier.get_many([key], [block_hash])
    print("got", hashlib.sha256(got).hexdigest() if got else "none", flush=True)
    mine = make_block(0, data_bytes=64 << 10, seed=seed)
    tier.put_many([mine])
    print("put", mine[0], tier.stats.errors, flush=True)
    sys.stdin.readline()
    tier.close()


if __name__ == "__main__":
    main()
