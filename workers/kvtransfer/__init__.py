"""Moving KV-cache blocks between replicas (prefill → decode).

- `layout`: what two engines must agree on (model, dtype, block size, layers, KV heads, head
  dim, parallel ranks) and where a block's bytes live in the engine's KV tensor.
- `mooncake`: the Mooncake Transfer Engine backend (TCP here, RDMA where the NICs exist).
- `ranks`: a tensor/pipeline-parallel replica's transfers, each rank moving its own shard.

The flow (see workers/replica/disagg.py): the decode replica reserves blocks and sends their
ids with its endpoint and layout to the prefill replica; the prefill replica computes the
prompt, writes its blocks straight into the reserved ones, then hands over the first token.
"""

from workers.kvtransfer.layout import KVTransferError, block_segments, layout_mismatch

__all__ = ["KVTransferError", "block_segments", "layout_mismatch"]
