"""What a rank's memory holds after load: weights, KV cache, and everything else."""

from __future__ import annotations

import resource

import torch


def weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of the weights' storage: parameters and the state dict's buffers, which is where
    quantized layers keep their packed weights and scales (a tied weight counted once)."""
    seen, total = set(), 0
    for p in (*module.parameters(), *module.state_dict().values()):
        storage = p.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def rank_memory(rank: int, model: torch.nn.Module, kv_cache: torch.Tensor, device: torch.device) -> dict:
    """{"rank", "weights", "kv_cache", "other"} in bytes. "other" is the rest of what the
    process holds: on CUDA the allocator's reserved memory less weights and KV (activations,
    workspace); on CPU the resident set less both (the Python and torch runtime too)."""
    weights = weight_bytes(model)
    kv = kv_cache.untyped_storage().nbytes()
    if device.type == "cuda":
        total = torch.cuda.memory_reserved(device)
    else:
        # The resident set now (the peak, ru_maxrss, survives exec: a spawned rank would report
        # its parent's).
        with open("/proc/self/statm") as f:
            total = int(f.read().split()[1]) * resource.getpagesize()
    return {"rank": rank, "weights": weights, "kv_cache": kv, "other": max(total - weights - kv, 0)}
