"""What any engine on this scheduler checks before admitting a request, and what it reports of
its batch: shared by LLMEngine and the simulated engine (workers/sim), torch-free."""

from __future__ import annotations

from workers.engine.block_manager import BlockManager
from workers.engine.errors import RequestError
from workers.engine.sampling_params import SamplingParams
from workers.engine.scheduler import Scheduler


def check_prompt(prompt_token_ids: list[int], vocab_size: int, max_model_len: int) -> None:
    """RequestError if the prompt cannot be served: empty, unknown token ids, no room to generate."""
    if not prompt_token_ids:
        raise RequestError("the prompt is empty", "prompt")
    bad = [t for t in prompt_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise RequestError(f"prompt token ids out of range [0, {vocab_size}): {bad[:5]}", "prompt")
    if len(prompt_token_ids) >= max_model_len:
        raise RequestError(
            f"the prompt is {len(prompt_token_ids)} tokens; this model's context is {max_model_len} tokens "
            "and at least one must be left to generate",
            "prompt",
        )


def check_params(params: SamplingParams, vocab_size: int) -> None:
    """What SamplingParams cannot check alone: logit_bias ids within this vocabulary."""
    bad = [t for t in params.logit_bias or () if t >= vocab_size]
    if bad:
        raise RequestError(f"logit_bias token ids out of range [0, {vocab_size}): {bad[:5]}", "logit_bias")


def batch_stats(scheduler: Scheduler, bm: BlockManager, generated_tokens: int, request_errors: int) -> dict:
    """The replica's load report's engine part (ReplicaServer._heartbeat reads it)."""
    return {
        "running": len(scheduler.running),
        "waiting": len(scheduler.waiting),
        "kv_blocks_total": bm.num_blocks,
        "kv_blocks_free": bm.num_free_blocks,
        "prefix_cache_queries": bm.queries,
        "prefix_cache_hits": bm.hits,
        "preemptions": scheduler.num_preemptions,
        "generated_tokens": generated_tokens,
        "request_errors": request_errors,
        # tenant -> [prompt tokens, generated tokens] served (fair_share.py)
        "tenants": {tenant: list(served) for tenant, served in scheduler.fair.served.items()},
    }
