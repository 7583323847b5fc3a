"""The request inspector: the last requests of each deployment, each with its timeline (queue,
prefill, decode as its replica timed them; its moves to other replicas) and outcome, kept in
Redis (a capped list per deployment) as each request ends. The console's deployment page shows
them, and events that name a request (`request.resumed`, `replica.crashed`) link to it.

Beside them, the time to first token of each deployment's last interactive requests (a batch's
lines are not interactive): the batch dispatcher holds its lines back when these break the
deployment's TTFT SLO (controlplane/batches/slo_gate.py)."""

from __future__ import annotations

import json
import logging
import time

import redis.asyncio as aioredis

log = logging.getLogger(__name__)

KEEP = 50
TTFT_KEEP = 256


def key(slug: str) -> str:
    return f"switchyard:recent-requests:{slug}"


def ttft_key(slug: str) -> str:
    return f"switchyard:interactive-ttft:{slug}"


def summary(gen, error: str | None) -> dict:
    """What the inspector keeps of a Generation that ended (`error`: why it failed)."""
    final = gen.final_event
    usage = (final.usage or {}) if final is not None else {}
    timings = (final.timings or {}) if final is not None else {}
    started = gen.created
    return {
        "id": gen.request_id,
        "at": round(time.time(), 3),
        "started": started,
        "caller": gen.caller.label,
        "replica": gen.route.replica_id,
        "prefill_replica": gen.prefill_replica,
        "status": "error" if error else "ok",
        "error": error,
        "finish_reason": final.finish_reason if final is not None else None,
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": usage.get("cached_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "ttft_ms": round((gen.first_token_at - gen.started_mono) * 1000, 1) if gen.first_token_at else None,
        "total_ms": round((time.monotonic() - gen.started_mono) * 1000, 1),
        "queue_ms": timings.get("queue_ms"),
        "prefill_ms": timings.get("prefill_ms"),
        "decode_ms": timings.get("decode_ms"),
        "grammar_ms": timings.get("grammar_ms"),
        "kv_transfer_ms": ((getattr(final, "disaggregation", None) or {}).get("prefill") or {}).get("transfer_ms"),
        "resumed": gen.resumed,
    }


async def record(client: aioredis.Redis, slug: str, item: dict, interactive: bool = True) -> None:
    try:
        pipe = client.pipeline(transaction=False)
        pipe.lpush(key(slug), json.dumps(item))
        pipe.ltrim(key(slug), 0, KEEP - 1)
        if interactive and item["ttft_ms"] is not None:
            pipe.lpush(ttft_key(slug), f"{item['at']}:{item['ttft_ms']}")
            pipe.ltrim(ttft_key(slug), 0, TTFT_KEEP - 1)
        await pipe.execute()
    except aioredis.RedisError:  # the inspector must not fail the request it shows
        log.warning("could not keep request %s for the inspector", item.get("id"), exc_info=True)


def recent(client, slug: str) -> list[dict]:
    """The deployment's last requests, newest first (a synchronous client)."""
    return [json.loads(raw) for raw in client.lrange(key(slug), 0, KEEP - 1)]


def interactive_ttfts(client, slug: str, after: float) -> list[tuple[float, float]]:
    """(when it ended, its TTFT in ms) for each of the deployment's last interactive requests
    that ended after `after` (the web process's time.time()), as a synchronous client reads them.
    Every kept one is looked at: pushes from several web processes need not be in order."""
    out = []
    for raw in client.lrange(ttft_key(slug), 0, TTFT_KEEP - 1):
        at, _, ms = raw.partition(":")
        if float(at) > after:
            out.append((float(at), float(ms)))
    return out
