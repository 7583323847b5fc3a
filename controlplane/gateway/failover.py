"""Mid-stream failover: what the gateway keeps of a request so that, when its replica dies, hangs
or restarts under it, the request resumes on another ready replica and the client sees one
uninterrupted answer (`Generation.events` does the resuming).

Kept per request (`Progress`): the prompt's token ids (the gateway's own tokenisation; where it
cannot read the model, see tokenization.py, the first replica's `accepted` returns them when
asked, so a chat template is rendered once), the output token ids the client has received and
how many characters of their text. The resumed request goes out as token ids,
prompt + output, with `resume: {"output_tokens", "text_sent"}`. The engine counts those tokens as
output (max_tokens, penalties, usage), draws each seeded token from (seed, output position)
alone, so a seeded request draws what it would have, and rebuilds their text so that what the
failed replica held back (text that could start a stop string) is sent next and a stop string
across the seam is still caught.

Each resume is counted in Redis for `/metrics` (`switchyard_requests_resumed_total`, and
`switchyard_requests_failover_failed_total` when no replica could take the request), recorded as
a `request.resumed` event and listed in the answer's `x_switchyard.resumed`. FAILOVER=false turns
it off; a request is resumed at most MAX_RESUMES times.

Poison requests: a request that was in flight when a replica died may be what killed it. Sent on
to another replica it is a suspect there (`Losses`, workers/protocol/suspects.py), so that if that
replica dies too, its node agent attributes the death to the request and does not count it toward
the replica's restart limit; and a request lost with a second replica (before or after either
accepted it) is not sent to a third but ended with a 502 `replicas_lost`, counted
(`switchyard_poison_requests_total`) and recorded as a `request.poison` event. One poison
request so costs at most two deaths and one counted restart, never the deployment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings

from controlplane.deployments.models import Deployment
from controlplane.events.services import record_event
from workers.protocol.replica import DeltaEvent, GenerateMessage, Resume
from workers.protocol.suspects import SUSPECT_TTL_SECONDS, Suspect, suspects_key

log = logging.getLogger(__name__)
MAX_RESUMES = 1  # a second loss ends the request (Losses.poisoned) before a second resume could
POISON_AFTER_LOSSES = 2
# Hash: "<deployment slug>:<outcome>" -> count, across web processes.
COUNTS_KEY = "switchyard:gateway:failover"
OUTCOMES = ("resumed", "failed", "poison")


def enabled() -> bool:
    return bool(settings.SWITCHYARD.get("FAILOVER", True))


@dataclass
class Progress:
    """What the client has received of one request, enough to resume it elsewhere."""

    prompt_ids: list[int] | None  # None: unknown (untokenised, and the replica did not return them)
    output_ids: list[int] = field(default_factory=list)
    text_sent: int = 0  # characters of the output's text, as the replicas sent it
    resumed: list[dict] = field(default_factory=list)  # {"from_replica", "to_replica", "after_tokens"}
    failed_replicas: set[int] = field(default_factory=set)

    def observe(self, event: DeltaEvent) -> None:
        self.output_ids += event.token_ids
        self.text_sent += len(event.text)

    def can_resume(self) -> bool:
        return len(self.resumed) < MAX_RESUMES and (not self.output_ids or self.prompt_ids is not None)

    def message(self, original: GenerateMessage) -> GenerateMessage:
        """The replica message that continues the request `original` began."""
        if not self.output_ids:  # nothing generated yet: the request as it was
            return replace(original)
        return replace(
            original,
            messages=None,
            tools=None,
            prompt=None,
            prompt_token_ids=[*self.prompt_ids, *self.output_ids],
            return_prompt_token_ids=False,
            resume=Resume(len(self.output_ids), self.text_sent),
        )


@dataclass
class Losses:
    """The replicas lost under one request, each with the request in flight (a death it may have
    caused), and the suspect entry of the replica it runs on now, if it is a suspect there."""

    request_id: str | None = None  # as the client knows it; None until placed (an attempt's own id)
    lost: list[dict] = field(default_factory=list)  # {"replica", "incarnation"}, in order
    mark: tuple[str, str] | None = None  # (key, field) of the suspect entry of the stream in flight

    def add(self, replica_id: int, incarnation: str | None) -> None:
        self.lost.append({"replica": replica_id, "incarnation": incarnation or ""})
        self.mark = None  # that replica died with it: its agent reads the entry, so it stays

    @property
    def poisoned(self) -> bool:
        return len(self.lost) >= POISON_AFTER_LOSSES

    @property
    def replicas(self) -> list[int]:
        return [entry["replica"] for entry in self.lost]

    async def mark_suspect(
        self, client: aioredis.Redis, replica_id: int, incarnation: str | None, attempt_id: str
    ) -> None:
        """Before the request goes to `replica_id` after a loss: written first, so the replica
        cannot die of it unattributed. Without an incarnation to key it by (a replica too old to
        report one) or with Redis away, it is sent unmarked: a death of it then counts."""
        if not self.lost or not incarnation:
            return
        key = suspects_key(replica_id, incarnation)
        value = Suspect(self.request_id or attempt_id, list(self.lost)).encode()
        try:
            async with client.pipeline(transaction=False) as pipe:
                await pipe.hset(key, attempt_id, value).expire(key, SUSPECT_TTL_SECONDS).execute()
        except aioredis.RedisError:
            log.warning("could not mark %s a suspect on replica %s", attempt_id, replica_id, exc_info=True)
            return
        self.mark = (key, attempt_id)

    async def clear(self, client: aioredis.Redis) -> None:
        """The stream in flight ended some other way than by its replica's loss (finished, failed,
        refused, abandoned): the replica's later deaths are not this request's."""
        if self.mark is None:
            return
        (key, attempt_id), self.mark = self.mark, None
        try:
            await client.hdel(key, attempt_id)
        except aioredis.RedisError:  # the entry expires by itself
            log.warning("could not clear the suspect entry %s", attempt_id, exc_info=True)


async def count(client: aioredis.Redis, deployment: Deployment, outcome: str) -> None:
    try:
        await client.hincrby(COUNTS_KEY, f"{deployment.slug}:{outcome}", 1)
    except aioredis.RedisError:  # a lost count must not fail the request it counts
        log.warning("could not count a failover (%s) of %s", outcome, deployment.slug, exc_info=True)


def counts(client) -> dict[str, dict[str, int]]:
    """{deployment slug: {"resumed": n, "failed": n, "poison": n}} (a synchronous client: `/metrics`)."""
    out: dict[str, dict[str, int]] = {}
    for name, value in (client.hgetall(COUNTS_KEY) or {}).items():
        slug, _, outcome = name.rpartition(":")
        if outcome in OUTCOMES:
            out.setdefault(slug, dict.fromkeys(OUTCOMES, 0))[outcome] = int(value)
    return out


@sync_to_async
def _record(verb: str, deployment: Deployment, data: dict) -> None:
    record_event(verb, deployment, actor_label="gateway", data=data)


async def record(verb: str, deployment: Deployment, data: dict) -> None:
    """An event in the audit log; never fails the request (the database may be away)."""
    try:
        await _record(verb, deployment, data)
    except Exception:
        log.warning("could not record %s for %s", verb, deployment.slug, exc_info=True)
