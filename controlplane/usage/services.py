"""Usage per tenant. The gateway counts each finished request in Redis (one hash per hour, a
field per owner, key, deployment and count: an HINCRBY, no database write on the request's
path); the `usage.flush` beat task moves the counts into hourly rows (UsageHour) and deletes rows
older than USAGE_RETENTION_DAYS. A flush renames the hash first, so counts that arrive meanwhile
go to a fresh one, and records its name with the rows it adds: a flush retried after a crash
adds nothing twice. The counts are the `usage` the client was answered with: input tokens once
per request, cached input tokens, output tokens of every choice.
"""

from __future__ import annotations

import csv
import io
import logging
import uuid
from datetime import UTC, datetime, timedelta

import redis.asyncio as aioredis
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Sum
from django.utils import timezone

from controlplane.usage.models import UsageFlush, UsageHour

log = logging.getLogger(__name__)

PREFIX = "switchyard:usage:"
PENDING = f"{PREFIX}hour:"  # + YYYYmmddHH: the counts of that hour not yet in the database
FLUSHING = f"{PREFIX}flush:"  # + a uuid: counts renamed for a flush
COUNTS = ("requests", "input_tokens", "cached_tokens", "output_tokens")
GROUPS = ("owner", "api_key", "deployment", "hour")


def _hour_key(now: datetime | None = None) -> str:
    return PENDING + (now or datetime.now(UTC)).strftime("%Y%m%d%H")


async def count(
    client: aioredis.Redis, owner_id: int | None, key_id: int | None, deployment: str, usage: dict, first: bool
) -> None:
    """One choice's final `usage` (`first`: the request's first: its request and input count)."""
    counts = {"output_tokens": int(usage.get("completion_tokens", 0))}
    if first:
        counts.update(
            requests=1,
            input_tokens=int(usage.get("prompt_tokens", 0)),
            cached_tokens=int(usage.get("cached_tokens", 0)),
        )
    key, who = _hour_key(), f"{owner_id or 0}|{key_id or 0}|{deployment}"
    try:
        pipe = client.pipeline(transaction=False)
        for name, value in counts.items():
            if value:
                pipe.hincrby(key, f"{who}|{name}", value)
        pipe.expire(key, 7 * 24 * 3600)  # a flush that never runs: Redis lets go of it in a week
        await pipe.execute()
    except aioredis.RedisError:  # a lost count must not fail the request it counts
        log.warning("could not count the usage of a request to %s", deployment, exc_info=True)


def flush(client) -> int:
    """Move the counts (a synchronous Redis client) into the database; returns rows touched."""
    touched = 0
    for key in sorted(client.scan_iter(match=f"{FLUSHING}*")):  # an earlier flush that did not finish
        touched += _apply(client, key)
    for key in sorted(client.scan_iter(match=f"{PENDING}*")):
        target = f"{FLUSHING}{key.removeprefix(PENDING)}:{uuid.uuid4().hex}"
        try:
            client.rename(key, target)
        except Exception:  # gone meanwhile (another flush took it)
            continue
        touched += _apply(client, target)
    _expire_rows()
    return touched


def _apply(client, key: str) -> int:
    raw = client.hgetall(key)
    hour = datetime.strptime(key.removeprefix(FLUSHING).split(":")[0], "%Y%m%d%H").replace(tzinfo=UTC)
    rows: dict[tuple[int, int, str], dict[str, int]] = {}
    for field, value in raw.items():
        owner, api_key, rest = field.split("|", 2)
        deployment, name = rest.rsplit("|", 1)
        if name in COUNTS:
            rows.setdefault((int(owner), int(api_key), deployment), {})[name] = int(value)
    try:
        with transaction.atomic():
            _, new = UsageFlush.objects.get_or_create(key=key)
            if new:  # not applied by a flush that crashed before deleting the hash
                for (owner, api_key, deployment), counts in rows.items():
                    _add(hour, owner or None, api_key or None, deployment, counts)
    except IntegrityError:  # a concurrent flush wrote the same row first: this one is tried again later
        log.warning("usage flush of %s raced another; retrying later", key)
        return 0
    client.delete(key)
    return len(rows)


def _add(hour, owner: int | None, api_key: int | None, deployment: str, counts: dict[str, int]) -> None:
    rows = UsageHour.objects.filter(hour=hour, owner_id=owner, api_key_id=api_key, deployment=deployment)
    if not rows.update(**{name: F(name) + value for name, value in counts.items()}):
        UsageHour.objects.create(hour=hour, owner_id=owner, api_key_id=api_key, deployment=deployment, **counts)


def _expire_rows() -> None:
    cutoff = timezone.now() - timedelta(days=settings.USAGE_RETENTION_DAYS)
    UsageHour.objects.filter(hour__lt=cutoff).delete()
    UsageFlush.objects.filter(created_at__lt=cutoff).delete()


def report(rows, group_by: str) -> list[dict]:
    """Totals of `rows` (a UsageHour queryset) per `group_by` (owner, api_key, deployment, hour)."""
    field = {"owner": "owner__username", "api_key": "api_key__name", "deployment": "deployment", "hour": "hour"}[
        group_by
    ]
    values = ["owner__username", "api_key__name", "api_key__prefix"] if group_by == "api_key" else [field]
    totals = rows.values(*values).annotate(**{name: Sum(name) for name in COUNTS}).order_by(*values)
    out = []
    for row in totals:
        item = {group_by: row[field].isoformat() if group_by == "hour" else row[field]}
        if group_by == "api_key":
            item.update(owner=row["owner__username"], api_key_prefix=row["api_key__prefix"])
        out.append({**item, **{name: row[name] or 0 for name in COUNTS}})
    return out


def as_csv(results: list[dict]) -> str:
    buffer = io.StringIO()
    if results:
        writer = csv.DictWriter(buffer, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)
    return buffer.getvalue()
