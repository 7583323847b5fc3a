"""Per-key request and token limits over fixed one-minute windows in Redis.

A request is refused with 429 and `Retry-After` (seconds to the next window) when the key has
made `rpm_limit` requests this minute, or has already used `tpm_limit` tokens (prompt plus
completion, counted when each request finishes).
"""

from __future__ import annotations

import math
import time

from controlplane.gateway.openai_request import OpenAIError

WINDOW = 60


def _window() -> tuple[int, int]:
    now = time.time()
    return int(now // WINDOW), max(math.ceil(WINDOW - now % WINDOW), 1)


async def check(redis, key) -> None:
    if key is None or (key.rpm_limit is None and key.tpm_limit is None):
        return
    window, retry = _window()
    if key.tpm_limit is not None:
        used = int(await redis.get(f"switchyard:rl:{key.pk}:tokens:{window}") or 0)
        if used >= key.tpm_limit:
            raise OpenAIError(
                429,
                f"Rate limit reached: {used} tokens used this minute (limit {key.tpm_limit} per minute).",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(retry)},
            )
    if key.rpm_limit is not None:
        name = f"switchyard:rl:{key.pk}:requests:{window}"
        pipe = redis.pipeline(transaction=True)
        pipe.incr(name)
        pipe.expire(name, WINDOW * 2)
        count, _ = await pipe.execute()
        if count > key.rpm_limit:
            raise OpenAIError(
                429,
                f"Rate limit reached: {key.rpm_limit} requests per minute.",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(retry)},
            )


async def count_tokens(redis, key, tokens: int) -> None:
    if key is None or key.tpm_limit is None or tokens <= 0:
        return
    window, _ = _window()
    name = f"switchyard:rl:{key.pk}:tokens:{window}"
    pipe = redis.pipeline(transaction=True)
    pipe.incrby(name, tokens)
    pipe.expire(name, WINDOW * 2)
    await pipe.execute()
