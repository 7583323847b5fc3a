"""What the engine returns: per-step deltas (for the replica loop) and whole results (offline)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" | None while running
    stop_reason: int | str | None = None
    error: str | None = None  # why the engine ended this sample (finish_reason "error")


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: dict = field(default_factory=dict)


@dataclass
class RequestDelta:
    """What one `LLMEngine.step()` produced for one request."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list[dict[int, float]] | None
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    stop_reason: int | str | None = None
    index: int = 0  # which of the request's `n` samples (parallel_sampling.py)
    # The engine failed while stepping this request (finish_reason "error"): what went wrong,
    # one line; the traceback is in the engine's log. Every other request carries on.
    error: str | None = None
    # time.monotonic() when the engine first scheduled the request (the end of its queueing):
    # the replica's queue / prefill / decode times.
    scheduled_at: float | None = None
