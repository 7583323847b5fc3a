from workers.engine import block_manager as bm_module
from workers.engine.block_manager import BlockManager, chain_hash
from workers.engine.sampling_params import SamplingParams
from workers.engine.sequence import Sequence


def seq(tokens, rid="r"):
    return Sequence(rid, tokens, SamplingParams(max_tokens=4))


def finish_prefill(bm, s):
    bm.mark_computed(s, s.num_tokens - s.num_computed_tokens)


def test_chain_hash_depends_on_prefix_and_is_stable():
    assert chain_hash(None, [1, 2]) == chain_hash(None, [1, 2])
    assert chain_hash(chain_hash(None, [1, 2]), [3]) != chain_hash(chain_hash(None, [9, 2]), [3])


def test_shared_prefix_blocks_are_reused_and_ref_counted():
    bm = BlockManager(num_blocks=10, block_size=4)
    a = seq(list(range(10)), "a")
    assert bm.allocate(a, 100) == 0
    finish_prefill(bm, a)
    b = seq([*list(range(8)), 77, 78, 79], "b")
    assert bm.allocate(b, 100) == 8  # two full blocks shared
    assert b.block_table[:2] == a.block_table[:2]
    assert bm.blocks[a.block_table[0]].ref_count == 2
    bm.free(a)
    assert bm.blocks[b.block_table[0]].ref_count == 1
    bm.free(b)
    assert bm.num_free_blocks == 10


def test_whole_prompt_cached_still_leaves_one_token_to_compute():
    bm = BlockManager(num_blocks=10, block_size=4)
    a = seq(list(range(8)), "a")
    bm.allocate(a, 100)
    finish_prefill(bm, a)
    bm.free(a)
    b = seq(list(range(8)), "b")
    assert bm.allocate(b, 100) == 4


def test_hash_collision_is_caught_by_token_verification(monkeypatch):
    # A real collision of a 64-bit hash cannot be produced on demand; force one.
    monkeypatch.setattr(bm_module, "chain_hash", lambda prev, tokens: 42)
    bm = BlockManager(num_blocks=10, block_size=4)
    a = seq([1, 2, 3, 4, 5], "a")
    bm.allocate(a, 100)
    finish_prefill(bm, a)
    b = seq([9, 9, 9, 9, 5], "b")
    assert bm.allocate(b, 100) == 0
    assert b.block_table[0] != a.block_table[0]


def test_freed_cached_blocks_evicted_least_recently_used_first():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = seq([1, 2, 3, 4, 5], "a")  # blocks: [1,2] [3,4] [5]
    bm.allocate(a, 100)
    finish_prefill(bm, a)
    bm.free(a)
    assert len(bm.free_cached) == 2 and len(bm.free_uncached) == 2
    # Needs 3 fresh blocks: both uncached ones, then the LRU cached one ([3,4], freed first).
    b = seq([7, 7, 8, 8, 9], "b")
    bm.allocate(b, 100)
    assert bm.hash_to_block.get(chain_hash(None, (1, 2))) is not None
    assert bm.hash_to_block.get(chain_hash(chain_hash(None, (1, 2)), (3, 4))) is None


def test_allocation_fails_cleanly_when_full():
    bm = BlockManager(num_blocks=2, block_size=4)
    a = seq(list(range(12)), "a")
    assert bm.allocate(a, 100) is None
    assert a.block_table == [] and bm.num_free_blocks == 2


class Loaded:
    """A block a KV tier found for a sequence (tiered_cache.FetchedBlock's shape)."""

    def __init__(self, index, h, token_ids):
        self.index, self.hash, self.token_ids = index, h, tuple(token_ids)


def loaded_for(tokens, block_size, indices):
    hashes, prev = [], None
    for i in range(len(tokens) // block_size):
        prev = chain_hash(prev, tokens[i * block_size : (i + 1) * block_size])
        hashes.append(prev)
    return [Loaded(i, hashes[i], tokens[i * block_size : (i + 1) * block_size]) for i in indices]


def test_evicted_blocks_are_handed_over_before_reuse_with_their_identity():
    seen = []
    bm = BlockManager(num_blocks=4, block_size=2, on_evict=lambda b: seen.append((b.block_id, b.hash, b.token_ids)))
    a = seq([1, 2, 3, 4, 5], "a")
    bm.allocate(a, 100)
    finish_prefill(bm, a)
    second = a.block_table[1]
    bm.free(a)
    bm.allocate(seq([7, 7, 8, 8, 9], "b"), 100)  # needs 3 fresh blocks: evicts [3, 4], the LRU one
    assert seen == [(second, chain_hash(chain_hash(None, (1, 2)), (3, 4)), (3, 4))]


def test_tier_blocks_extend_the_device_prefix_and_join_the_cache():
    tokens = list(range(1, 14))  # 3 full blocks of 4 can be served, the 13th token is computed
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq(tokens[:5], "a")  # the device holds block 0 only
    bm.allocate(a, 100)
    finish_prefill(bm, a)
    bm.free(a)
    written = []
    b = seq(tokens, "b")
    cached = bm.allocate(b, 100, loaded_for(tokens, 4, [1, 2]), lambda bid, blk: written.append((bid, blk.index)))
    assert cached == 12 and b.num_computed_tokens == 12
    assert [i for _, i in written] == [1, 2]
    assert [bid for bid, _ in written] == b.block_table[1:3]
    for bid, blk in zip(b.block_table[1:3], loaded_for(tokens, 4, [1, 2]), strict=True):
        assert bm.hash_to_block[blk.hash] == bid  # findable by the next request
    assert bm.take_kv_events()[0][-2:] == [blk.hash for blk in loaded_for(tokens, 4, [1, 2])]


def test_tier_blocks_after_a_gap_are_not_used():
    tokens = list(range(1, 14))
    bm = BlockManager(num_blocks=8, block_size=4)
    b = seq(tokens, "b")  # nothing on the device: blocks 1 and 2 alone would leave a hole at 0
    written = []
    assert bm.allocate(b, 100, loaded_for(tokens, 4, [1, 2]), lambda bid, blk: written.append(bid)) == 0
    assert written == []
