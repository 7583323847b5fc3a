"""A request's token counts, read once from its choices' last deltas; each dialect names them its
own way."""

from __future__ import annotations

from dataclasses import dataclass

from workers.protocol.replica import DeltaEvent


@dataclass(frozen=True)
class TokenCounts:
    prompt: int
    completion: int  # every choice's
    cached: int = 0  # prompt tokens read from the prefix cache


def counts(finals: list[DeltaEvent]) -> TokenCounts:
    """The prompt once (the choices share it), the completion tokens of every choice."""
    u = finals[0].usage or {}
    completion = sum((event.usage or {})["completion_tokens"] for event in finals)
    return TokenCounts(u["prompt_tokens"], completion, u.get("cached_tokens", 0))
