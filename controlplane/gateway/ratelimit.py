"""Per-key request and token limits over fixed one-minute windows in Redis.

A request is refused with 429 and `Retry-After` (seconds to the next window) when the key has
made `rpm_limit` requests this minute, or when its prompt would take the tokens used this minute
past `tpm_limit`. The gateway knows a prompt's exact tokens before it is dispatched (it tokenises
it), so prompt tokens count when the request is sent and completion tokens when it finishes; a
prompt larger than the whole per-minute budget is refused without `Retry-After` (waiting would
not help). A prompt the gateway could not tokenise (a model it cannot read) is checked against the
tokens already used, and counts when it finishes.
"""

from __future__ import annotations

import math
import time

from controlplane.gateway.core import GatewayError

WINDOW = 60


def _window() -> tuple[int, int]:
    now = time.time()
    return int(now // WINDOW), max(math.ceil(WINDOW - now % WINDOW), 1)


async def check(redis, key, prompt_tokens: int | None = None) -> None:
    """Refuse the request (429) if it would pass the key's limits; `prompt_tokens`: its exact
    prompt size, None when the gateway could not tokenise it."""
    if key is None or (key.rpm_limit is None and key.tpm_limit is None):
        return
    window, retry = _window()
    if key.tpm_limit is not None:
        if prompt_tokens is not None and prompt_tokens > key.tpm_limit:
            raise GatewayError(
                429,
                f"Request too large: its prompt has {prompt_tokens} tokens, more than this key may use in a minute"
                f" ({key.tpm_limit}).",
                code="rate_limit_exceeded",
            )
        used = int(await redis.get(f"switchyard:rl:{key.pk}:tokens:{window}") or 0)
        if used + (prompt_tokens or 0) > key.tpm_limit or used >= key.tpm_limit:
            raise GatewayError(
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
            raise GatewayError(
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
