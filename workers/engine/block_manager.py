"""Paged KV-cache bookkeeping: which physical blocks each sequence uses, with prefix caching.

* Blocks are reference-counted; a block shared by several sequences is freed when the last
  one lets go.
* A full block is identified by a chained hash (hash of the previous block's hash and this
  block's token ids). A new sequence whose prompt starts with the same blocks reuses them;
  every hit is verified against the stored token ids, so a hash collision never reuses wrong KV.
* Freed blocks that carry a hash stay findable until their memory is needed: they are evicted
  least-recently-used first, after all never-cached free blocks are used up.
* Every hash that enters or leaves the cache is recorded (`take_kv_events`), so the replica can
  publish which blocks it holds for prefix-aware routing (workers.protocol.kv_blocks).
* With KV tiers (tiered_cache.py): a cached block about to be evicted is first handed to
  `on_evict` (written back to host memory or disk), and `allocate` can take blocks loaded from a
  tier (`loaded`) to extend the prefix the device cache served.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import Protocol

from workers.engine.sequence import Sequence
from workers.protocol.kv_blocks import chain_hash  # routers compute the same hashes


class LoadedBlock(Protocol):
    """A block's K/V fetched from a KV tier, for `allocate`."""

    index: int  # its position in the sequence, in blocks
    hash: int
    token_ids: tuple[int, ...]


class Block:
    __slots__ = ("block_id", "hash", "ref_count", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: tuple[int, ...] = ()


class Blocks:
    """The blocks by id, each made on first use. A KV budget holds hundreds of thousands of blocks
    (a gigabyte of a small model's KV in blocks of 4 tokens: 524,288), most of which a replica
    never touches for a long while; making them all up front took nearly a second per engine."""

    __slots__ = ("_count", "_made")

    def __init__(self, count: int):
        self._made: dict[int, Block] = {}
        self._count = count

    def __getitem__(self, block_id: int) -> Block:
        block = self._made.get(block_id)
        if block is None:
            if not 0 <= block_id < self._count:
                raise IndexError(f"block {block_id} is not one of the {self._count}")
            block = self._made[block_id] = Block(block_id)
        return block

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Block]:
        return (self[i] for i in range(self._count))


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        on_evict: Callable[[Block], None] | None = None,
    ):
        """`on_evict(block)`: called with a cached block (hash, token ids and id still set, its
        K/V still in place) just before its memory is reused."""
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block; raise the KV memory budget")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = Blocks(num_blocks)
        self.free_uncached: deque[int] = deque(range(num_blocks))
        self.free_cached: OrderedDict[int, None] = OrderedDict()  # LRU order, oldest first
        self.hash_to_block: dict[int, int] = {}
        # Hashes that joined (True) or left (False) hash_to_block since take_kv_events.
        self._kv_changes: dict[int, bool] = {}
        self.hits = 0  # prompt blocks served from the cache (for metrics)
        self.queries = 0  # prompt blocks looked up
        self.on_evict = on_evict

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_uncached) + len(self.free_cached)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- admission ----------------------------------------------------------------------------
    def max_prefix_blocks(self, seq: Sequence) -> int:
        """How many leading full blocks of `seq` a cache could serve: all but the one holding its
        last token, whose logits start generation and so must be computed."""
        return (seq.num_tokens - 1) // self.block_size if self.enable_prefix_caching else 0

    def _prefix_hits(self, seq: Sequence) -> list[tuple[int, int]]:
        """(block_id, hash) of the leading full blocks of `seq` already in the cache."""
        hits: list[tuple[int, int]] = []
        prev = None
        bs = self.block_size
        for i in range(self.max_prefix_blocks(seq)):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(prev, tokens)
            bid = self.hash_to_block.get(h)
            if bid is None or self.blocks[bid].token_ids != tokens:
                break
            hits.append((bid, h))
            prev = h
        return hits

    def cached_prefix_blocks(self, seq: Sequence) -> int:
        """How many leading blocks of `seq` the device cache would serve now."""
        return len(self._prefix_hits(seq))

    def allocate(
        self,
        seq: Sequence,
        num_new_tokens: int,
        loaded: list[LoadedBlock] = (),
        write: Callable[[int, LoadedBlock], None] | None = None,
    ) -> int | None:
        """Give a waiting `seq` its cached prefix and room for its first `num_new_tokens`
        uncached tokens. Returns how many tokens the caches covered, or None (nothing changed)
        when there is not enough free memory.

        `loaded`: blocks a KV tier holds for `seq` (tiered_cache.py), in block order. Those that
        continue the device prefix without a gap get fresh blocks, which `write(block_id,
        block)` fills; they join the prefix cache at once, which is safe because everything here
        runs on the engine's thread before the next model step."""
        assert not seq.block_table
        hits = self._prefix_hits(seq)
        extra = [b for b in loaded if b.index >= len(hits)]
        if extra and extra[0].index != len(hits):  # the device lost blocks since the lookup: a gap
            extra = []
        cached = (len(hits) + len(extra)) * self.block_size
        revived = sum(1 for bid, _ in hits if self.blocks[bid].ref_count == 0)
        total = self.blocks_needed(cached + min(num_new_tokens, seq.num_tokens - cached))
        if total - len(hits) + revived > self.num_free_blocks:
            return None
        for bid, h in hits:
            self._take(bid)
            seq.block_table.append(bid)
            seq.block_hashes.append(h)
        for b in extra:
            bid = self._new_block()
            write(bid, b)
            block = self.blocks[bid]
            block.hash, block.token_ids = b.hash, b.token_ids
            if b.hash not in self.hash_to_block:
                self.hash_to_block[b.hash] = bid
                self._kv_changed(b.hash, True)
            seq.block_table.append(bid)
            seq.block_hashes.append(b.hash)
        self.queries += seq.num_tokens // self.block_size
        self.hits += len(hits)
        seq.num_computed_tokens = cached
        self.ensure_slots(seq, min(num_new_tokens, seq.num_tokens - cached))
        return cached

    def _take(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.ref_count == 0:
            self.free_cached.pop(bid, None)
        block.ref_count += 1

    def _new_block(self) -> int:
        if self.free_uncached:
            bid = self.free_uncached.popleft()
        else:
            bid, _ = self.free_cached.popitem(last=False)  # evict the least recently used
            block = self.blocks[bid]
            if self.on_evict is not None:
                self.on_evict(block)
            self._uncache(block)
            block.hash, block.token_ids = None, ()
        self.blocks[bid].ref_count = 1
        return bid

    def share_prefix(self, src: Sequence, dst: Sequence, num_blocks: int) -> None:
        """Give the empty `dst` the first `num_blocks` computed blocks of `src` (a forked
        sample, parallel_sampling.py): shared, not copied; each is freed when its last holder
        lets go."""
        assert not dst.block_table and num_blocks * self.block_size <= src.num_computed_tokens
        for bid in src.block_table[:num_blocks]:
            self._take(bid)
            dst.block_table.append(bid)
        dst.block_hashes = src.block_hashes[:num_blocks]  # empty without prefix caching
        dst.num_computed_tokens = num_blocks * self.block_size

    # -- growth -------------------------------------------------------------------------------
    def ensure_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make the block table cover `num_new_tokens` more tokens. False (and no change) if
        the cache is full."""
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if need > self.num_free_blocks:
            return False
        for _ in range(need):
            seq.block_table.append(self._new_block())
        return True

    def mark_computed(self, seq: Sequence, num_new_tokens: int) -> None:
        """Record that `num_new_tokens` more tokens have their K/V in the cache; blocks that
        became full get their hash and join the prefix cache."""
        seq.num_computed_tokens += num_new_tokens
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = seq.num_computed_tokens // bs
        while len(seq.block_hashes) < full:
            i = len(seq.block_hashes)
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            prev = seq.block_hashes[-1] if seq.block_hashes else None
            h = chain_hash(prev, tokens)
            seq.block_hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            if block.hash is None:
                block.hash, block.token_ids = h, tokens
                if h not in self.hash_to_block:  # else another block already serves this prefix
                    self.hash_to_block[h] = block.block_id
                    self._kv_changed(h, True)

    def trim(self, seq: Sequence) -> None:
        """Release the blocks past those holding `seq`'s computed tokens (speculative drafts
        the target rejected had their K/V written there). Those blocks were never hashed:
        `mark_computed` hashes only full blocks of computed tokens, and rejected drafts never
        count as computed. The kept last block may still hold rejected drafts' K/V past
        `num_computed_tokens`; nothing reads it, and the next tokens overwrite it before the
        block can fill and be hashed."""
        keep = self.blocks_needed(seq.num_computed_tokens)
        while len(seq.block_table) > keep:
            bid = seq.block_table.pop()
            assert self.blocks[bid].hash is None, "a block past the computed tokens was hashed"
            self._release(bid)

    # -- release ------------------------------------------------------------------------------
    def _release(self, bid: int) -> None:
        """Drop one reference; a block nobody holds joins the LRU if the prefix cache knows it,
        else the uncached free list."""
        block = self.blocks[bid]
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.hash is not None and self.hash_to_block.get(block.hash) == bid:
                self.free_cached[bid] = None
            else:
                block.hash, block.token_ids = None, ()
                self.free_uncached.append(bid)

    def free(self, seq: Sequence) -> None:
        # Release the tail first so that, under LRU, a prompt's later blocks go before its prefix.
        for bid in reversed(seq.block_table):
            self._release(bid)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    # -- disaggregation: blocks filled by another replica ---------------------------------------
    def reserve(self, num_tokens: int) -> list[int] | None:
        """Fresh blocks for `num_tokens` whose K/V another replica will write (None if full)."""
        need = self.blocks_needed(num_tokens)
        if need > self.num_free_blocks:
            return None
        return [self._new_block() for _ in range(need)]

    def release(self, block_ids: list[int]) -> None:
        """Give back reserved blocks that were never handed to a sequence (never hashed, so
        they go back uncached)."""
        for bid in block_ids:
            self._release(bid)

    def reset_prefix_cache(self) -> None:
        for bid in list(self.free_cached):
            block = self.blocks[bid]
            self._uncache(block)
            block.hash, block.token_ids = None, ()
            self.free_uncached.append(bid)
        self.free_cached.clear()

    # -- what the cache holds, for prefix-aware routing -----------------------------------------
    def _uncache(self, block: Block) -> None:
        """`block` leaves the prefix cache (if it is the one serving its hash)."""
        if block.hash is not None and self.hash_to_block.get(block.hash) == block.block_id:
            del self.hash_to_block[block.hash]
            self._kv_changed(block.hash, False)

    def _kv_changed(self, h: int, cached: bool) -> None:
        # A hash enters and leaves hash_to_block in turn, so a change still pending for it is
        # the opposite one: the two cancel out (what was taken last already says this). Hence
        # at most one entry per hash, and never more than the blocks cached now plus those
        # cached at the last take, even when nobody takes them (offline use).
        if self._kv_changes.pop(h, None) is None:
            self._kv_changes[h] = cached

    def take_kv_events(self) -> tuple[list[int], list[int]]:
        """(stored, removed): the hashes that joined and left the prefix cache since the last
        call (or the last `take_kv_snapshot`), net of changes that cancelled out: applied to the
        set as it stood then (empty at first), they give `set(hash_to_block)`. Always empty
        without prefix caching."""
        changes, self._kv_changes = self._kv_changes, {}
        stored = [h for h, cached in changes.items() if cached]
        removed = [h for h, cached in changes.items() if not cached]
        return stored, removed

    def take_kv_snapshot(self) -> list[int]:
        """Every hash the prefix cache can serve now; the pending events are part of it, so
        they are dropped (the next `take_kv_events` starts from this state)."""
        self._kv_changes = {}
        return list(self.hash_to_block)
