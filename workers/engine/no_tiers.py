"""No KV tiers: the null object the engine and the scheduler call when a replica has none. It
lives apart from tiered_cache.py (torch, the store) so that the scheduler, and the simulated
engine that reuses it (workers/sim), load without torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.engine.block_manager import BlockManager
    from workers.engine.sequence import Sequence
    from workers.engine.tiered_cache import FetchedBlock


class NoTiers:
    """No KV tiers: what the engine and the scheduler call on a TieredCache, doing nothing (a
    lookup finds nothing, at once), so neither asks whether there are tiers."""

    def ready(self, seq: Sequence, bm: BlockManager) -> bool:
        return True

    def loaded_blocks(self, seq: Sequence) -> list[FetchedBlock]:
        return []

    def write_block(self, block_id: int, block: FetchedBlock) -> None:
        raise AssertionError("no KV tier loaded a block")

    def admitted(self, seq: Sequence) -> None:
        pass

    def on_finish(self, seq: Sequence) -> None:
        pass

    def wait(self, timeout: float) -> None:
        pass

    def stats(self) -> None:
        return None

    def close(self) -> None:
        pass
