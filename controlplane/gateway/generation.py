"""One generation request from admission to its last event; shared by the OpenAI views and the
generate websocket, which differ only in how they format events.

Admission = authenticate → resolve the deployment (404/403) → rate limit (429) → tokenise (400
for a prompt over the context; tokenization.py) → route → submit to the replica → wait for its
`accepted` (or its 400).
Only then does a response start, so every refusal is a proper HTTP error, streaming or not.
A replica that is draining or dies before accepting is skipped for the next one. One that dies,
hangs or restarts after accepting is replaced mid-request (see failover.py), unless a replica was
lost under the request before: then it is suspected of killing them and ends (502 `replicas_lost`).
An engine that fails on the request alone ends it with a 500 `engine_error`, not resumed elsewhere:
it would fail the same way there.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace

from asgiref.sync import sync_to_async
from django.core.validators import slug_re
from django.utils import timezone
from redis.exceptions import RedisError

from controlplane.batches.tokens import batch_id_of
from controlplane.deployments.models import Deployment
from controlplane.gateway import failover, inspector, ratelimit, selectors, tokenization, tracing
from controlplane.gateway.core import GatewayError, GenerationRequest
from controlplane.gateway.core.checks import session_key
from controlplane.gateway.hub import BROKER_LOST, REPLICA_LOST, ReplicaHub, RequestStream, get_hub
from controlplane.gateway.models import ApiKey
from controlplane.gateway.routing import quality, router
from controlplane.gateway.services import authenticate
from controlplane.usage import services as usage_counts
from workers.protocol.replica import (
    BATCH_PRIORITY,
    ENGINE_ERROR,
    AcceptedEvent,
    DeltaEvent,
    ErrorEvent,
    GenerateMessage,
)

ATTEMPTS = 3
DEFAULT_SESSION_HEADER = "x-session-affinity"  # without a cache policy


@dataclass
class Caller:
    """Who is asking: an API key (the OpenAI API), or a signed-in user (the console)."""

    key: ApiKey | None
    allowed: frozenset[int] | None  # deployment ids; None: all
    label: str
    # Fair sharing between tenants (workers/engine/fair_share.py): the user served, and the
    # weight of the key they asked with.
    tenant: str = ""
    weight: float = 1.0
    min_priority: int = 0  # the most urgent priority it may ask for (ApiKey.min_priority)
    user_id: int | None = None  # whose usage it is (controlplane/usage): the key's owner, or the console's user

    @property
    def key_id(self) -> int | None:
        return self.key.pk if self.key is not None else None

    # A line of this batch (controlplane/batches): it runs at the batch priority, below every
    # interactive request, and outside the key's per-minute limits.
    batch: str | None = None


@sync_to_async
def caller_from_secret(secret: str | None) -> Caller:
    return caller_for_secret(secret)


def caller_for_secret(secret: str | None) -> Caller:
    if not secret:
        raise GatewayError(401, "Missing API key: send it as 'Authorization: Bearer sy-...'.", code="missing_api_key")
    batch_id = batch_id_of(secret)
    key = authenticate(secret) if batch_id is None else _batch_key(batch_id)
    if key is None:
        raise GatewayError(401, "Invalid or revoked API key.", code="invalid_api_key")
    allowed = frozenset(key.allowed_deployments.values_list("id", flat=True)) or None
    now = timezone.now()
    if key.last_used_at is None or (now - key.last_used_at).total_seconds() > 60:  # a write per minute at most
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    if batch_id is not None:
        return Caller(key, allowed, f"batch:{batch_id}", key.owner.get_username(), key.weight, batch=batch_id,
                      user_id=key.owner_id)  # fmt: skip
    return Caller(
        key, allowed, f"key:{key.prefix}", key.owner.get_username(), key.weight, key.min_priority, user_id=key.owner_id
    )


def _batch_key(batch_id: str) -> ApiKey | None:
    """The live key a batch was created with (None once it is revoked: its lines then fail)."""
    key = ApiKey.objects.filter(batches__pk=batch_id, revoked=False).select_related("owner").first()
    return key


def caller_from_user(user) -> Caller:
    return Caller(None, None, f"user:{user.get_username()}", user.get_username(), user_id=user.pk)


def secret_from_header(value: str | None) -> str | None:
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


@sync_to_async
def visible_deployments(caller: Caller) -> list[Deployment]:
    qs = Deployment.objects.filter(desired_state=Deployment.DesiredState.RUNNING).select_related("model")
    if caller.allowed is not None:
        qs = qs.filter(pk__in=caller.allowed)
    return list(qs.order_by("slug"))


def resolve(name: str, caller: Caller) -> Deployment:
    deployment = None
    if slug_re.match(name):  # any other name is no deployment's (and a NUL in it would fail the query)
        deployment = Deployment.objects.select_related("model", "cache_policy").filter(slug=name).first()
    if deployment is None:
        raise GatewayError(404, f"The model '{name}' does not exist (see GET /v1/models).", "model", "model_not_found")
    if caller.allowed is not None and deployment.pk not in caller.allowed:
        raise GatewayError(403, f"This API key may not use the model '{name}'.", "model", "model_not_allowed")
    if deployment.desired_state != Deployment.DesiredState.RUNNING:
        raise GatewayError(
            503, f"The model '{name}' is stopped.", "model", "model_stopped", headers={"Retry-After": "10"}
        )
    return deployment


resolve_deployment = sync_to_async(resolve)


@sync_to_async
def _deployment_and_replicas(name: str, caller: Caller) -> tuple[Deployment, dict[str, list[int]]]:
    """One trip to the database thread per request: each costs a thread hop."""
    deployment = resolve(name, caller)
    return deployment, selectors.candidate_ids(deployment.pk)


_candidate_ids = sync_to_async(selectors.candidate_ids)


@dataclass
class Generation:
    request_id: str
    deployment: Deployment
    route: router.Route
    stream: RequestStream
    caller: Caller
    # Disaggregated: the prefill replica computing the prompt (None: the decode replica does).
    # From `accepted` (the prompt was handed over), then from the last event (it really was).
    prefill_replica: int | None = None
    message: GenerateMessage = field(default_factory=GenerateMessage)  # what the first replica was sent
    progress: failover.Progress | None = None  # None: failover is off
    losses: failover.Losses = field(default_factory=failover.Losses)  # replicas lost under it
    prompt_counted: bool = False  # its prompt tokens counted against the key's TPM when it was sent
    usage_seen: bool = False  # a choice's final usage arrived (with `n` > 1 each choice sends one)
    trace: tracing.RequestTrace | None = None  # its span, when tracing is on (tracing.py)
    final_event: DeltaEvent | None = None  # the last choice's final event (its timings, for the trace)
    failure: str | None = None  # why it ended with an error, for the trace
    started_mono: float = field(default_factory=time.monotonic)  # when the gateway took it (start())
    inspected: bool = False  # kept for the request inspector (inspector.py) already
    created: int = field(default_factory=lambda: int(time.time()))
    started: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None

    @property
    def resumed(self) -> list[dict]:
        """Each move to another replica: {"from_replica", "to_replica", "after_tokens"}."""
        return self.progress.resumed if self.progress is not None else []

    async def events(self) -> AsyncIterator[DeltaEvent]:
        """Delta events, then the stream ends. A replica lost under the request (dead, hung,
        restarted) is replaced by another and the events go on from where they were; if none
        can take it, or the replica itself reports an error, an GatewayError ends them."""
        try:
            while not self.stream.finished:
                event = await self.stream.next_event()
                if isinstance(event, ErrorEvent):
                    if event.code == BROKER_LOST:
                        raise broker_unavailable(event.message)
                    if event.code == REPLICA_LOST and await self._resume(event):
                        continue
                    if event.code == ENGINE_ERROR:  # this request's alone: another replica would fail the same way
                        raise GatewayError(500, event.message or "the engine failed on this request", code=ENGINE_ERROR)
                    raise GatewayError(502, event.message or "replica error", code="replica_error")
                if not isinstance(event, DeltaEvent):  # `accepted` came first and was read by _place
                    continue
                if self.first_token_at is None:
                    self.first_token_at = time.monotonic()
                if self.trace is not None:
                    self.trace.observe(event)
                if event.final and self.prefill_replica is not None:
                    # A handoff that fell back (timeout, refusal) was prefilled by the decode replica.
                    self.prefill_replica = ((event.disaggregation or {}).get("prefill") or {}).get("replica")
                if event.final:
                    self.final_event = event
                if event.usage:  # one per choice (`n`): the prompt counts once
                    usage = event.usage
                    spent = usage["completion_tokens"] + (0 if self.prompt_counted else usage["prompt_tokens"])
                    if self.caller.batch is None:  # a batch's lines are paced by its dispatcher
                        await ratelimit.count_tokens(self.stream.hub.redis, self.caller.key, spent)
                    await usage_counts.count(self.stream.hub.redis, self.caller.user_id, self.caller.key_id,
                                             self.deployment.slug, usage, first=not self.usage_seen)  # fmt: skip
                    if not self.usage_seen:
                        await quality.record_usage(self.stream.hub.redis, self.deployment.slug, usage)
                    self.prompt_counted = self.usage_seen = True
                if self.progress is not None:
                    self.progress.observe(event)
                yield event
        except RedisError as exc:  # the broker went away under the request: a clean end
            self.failure = str(exc)
            raise broker_unavailable(exc) from None
        except GatewayError as exc:
            self.failure = exc.message
            raise
        finally:
            await self.close()

    async def _resume(self, lost: ErrorEvent) -> bool:
        """Continue the request on another ready replica of the deployment; False when failover
        is off or this request may not move again. Raises GatewayError when no replica can, or
        when this is the second replica lost under it (a poison request)."""
        lost_at = time.monotonic()
        progress = self.progress
        old = self.stream  # closed (aborted, uncounted) when it reported the loss
        self.losses.add(old.replica_id, old.incarnation)
        if self.losses.poisoned:
            raise await _poisoned(
                old.hub, self.deployment, self.losses, lost, len(progress.output_ids) if progress is not None else 0
            )
        if progress is None or not progress.can_resume():
            return False
        progress.failed_replicas.add(old.replica_id)
        after = len(progress.output_ids)
        attempts = itertools.count()
        move = len(progress.resumed) + 1
        try:
            candidates = await _candidate_ids(self.deployment.pk)
            route, stream, first = await _place(
                old.hub,
                self.deployment,
                candidates,
                progress.message(self.message),
                lambda: f"{self.request_id}-r{move}.{next(attempts)}",
                exclude=frozenset(progress.failed_replicas),
                losses=self.losses,
                after_tokens=after,
            )
        except PoisonRequest:
            raise
        except (GatewayError, RedisError) as exc:
            stream, reason = None, getattr(exc, "message", None) or str(exc)
        else:
            reason = None if stream is not None else first.message or "refused"
        if stream is None:
            await failover.count(old.hub.redis, self.deployment, "failed")
            await failover.record("request.failover_failed", self.deployment, {
                "request_id": self.request_id, "from_replica": old.replica_id, "after_tokens": after,
                "problem": lost.message, "reason": reason})  # fmt: skip
            raise GatewayError(
                503,
                f"{lost.message or 'the replica was lost'} after {after} tokens, and no other replica of "
                f"'{self.deployment.slug}' could resume the request; retry it.",
                code="no_ready_replica",
            )
        self.stream = stream
        if progress.prompt_ids is None:  # it had generated nothing: sent as it was, ids asked again
            progress.prompt_ids = first.prompt_token_ids
        note = {"from_replica": old.replica_id, "to_replica": route.replica_id, "after_tokens": after}
        progress.resumed.append(note)
        if self.trace is not None:
            self.trace.moved(note, lost_at)
        await failover.count(old.hub.redis, self.deployment, "resumed")
        await failover.record(
            "request.resumed", self.deployment, {"request_id": self.request_id, **note, "problem": lost.message}
        )
        return True

    def timings(self) -> dict:
        now = time.monotonic()
        ttft = (self.first_token_at - self.started) * 1000 if self.first_token_at else None
        return {
            "ttft_ms": round(ttft, 3) if ttft is not None else None,
            "total_ms": round((now - self.started) * 1000, 3),
        }

    async def close(self) -> None:
        """Safe to call more than once. A suspect entry of the stream goes: it ended by itself."""
        try:
            await self.stream.close()
        finally:
            if self.losses.mark is not None:
                await self.losses.clear(self.stream.hub.redis)
            trace, self.trace = self.trace, None  # its span ends once
            tracing.finish(trace, self.request_id, self.route.replica_id, self.final_event, self.failure)
            if not self.inspected:
                self.inspected = True
                kept = inspector.summary(self, self.failure)
                interactive = self.caller.batch is None
                await inspector.record(self.stream.hub.redis, self.deployment.slug, kept, interactive)


def broker_unavailable(exc: Exception | str) -> GatewayError:
    return GatewayError(
        503,
        f"The request broker is unavailable ({exc}); retry shortly.",
        code="broker_unavailable",
        headers={"Retry-After": "2"},
    )


async def _place(
    hub: ReplicaHub,
    deployment: Deployment,
    candidates: dict[str, list[int]],
    message: GenerateMessage,
    new_id: Callable[[], str],
    session: str | None = None,
    exclude: frozenset[int] = frozenset(),
    losses: failover.Losses | None = None,
    after_tokens: int = 0,
) -> tuple[router.Route, RequestStream | None, AcceptedEvent | ErrorEvent]:
    """Route `message`, send it and wait for the replica's first answer: (route, stream, its
    `accepted`), or (route, None, the refusal) when the replica refuses the request itself. A
    replica that is draining (503) or dies before answering is skipped for another, ATTEMPTS
    in all; raises GatewayError 503 when no replica is left. `losses`: the replicas lost under
    the request so far, where one that dies before answering is added; once one was, the next
    replica has the request as a suspect (failover.Losses), and a second raises (poison)."""
    losses = losses if losses is not None else failover.Losses()
    tried = set(exclude)
    for _ in range(ATTEMPTS):
        request_id = new_id()
        try:
            route = await router.choose(
                hub, deployment, candidates, request_id, session, frozenset(tried), message.prompt_token_ids
            )
            sent = replace(message, prefill_replica=route.prefill_replica_id)
            if losses.lost:
                await losses.mark_suspect(hub.redis, route.replica_id, route.incarnation, request_id)
            stream = await hub.submit(route.replica_id, request_id, sent, route.incarnation)
        except router.NoReadyReplica as exc:
            raise _no_ready_replica(exc) from None
        except BaseException:  # not sent (choose counts it before its last Redis calls): it must not count
            await hub.dispatched.done(request_id)
            if losses.mark is not None:
                await losses.clear(hub.redis)
            raise
        try:
            first = await stream.next_event()
        except BaseException:  # the client went away (cancelled) before the replica answered
            await stream.close()
            if losses.mark is not None:
                await losses.clear(hub.redis)
            raise
        if isinstance(first, AcceptedEvent):
            return route, stream, first
        await stream.close()
        if not isinstance(first, ErrorEvent):  # output before `accepted`: a replica out of protocol
            first = ErrorEvent(request_id, 502, f"the replica sent {first.TYPE!r} before accepting the request")
        if first.code == REPLICA_LOST:  # it died with the request in flight (a first step can kill it)
            losses.add(route.replica_id, route.incarnation)
            if losses.poisoned:
                raise await _poisoned(hub, deployment, losses, first, after_tokens)
        elif losses.mark is not None:  # refused or failed: it did not die of the request
            await losses.clear(hub.redis)
        if first.status in (502, 503):  # draining or died before accepting: try another
            tried.add(route.replica_id)
            continue
        return route, None, first
    raise GatewayError(
        503,
        f"No replica of '{deployment.slug}' could take the request.",
        code="no_ready_replica",
        headers={"Retry-After": "2"},
    )


class PoisonRequest(GatewayError):
    """A request lost with a second replica: ended, never resumed (`_poisoned`)."""


async def _poisoned(
    hub: ReplicaHub, deployment: Deployment, losses: failover.Losses, lost: ErrorEvent, after_tokens: int
) -> PoisonRequest:
    """A second replica was lost with the request in flight: it is not sent to a third (it may be
    what kills them). Counted and recorded; the error to end it with."""
    rid = losses.request_id or lost.id
    first, second = losses.replicas[:2]
    await failover.count(hub.redis, deployment, "poison")
    data = {"request_id": rid, "replicas": losses.replicas, "after_tokens": after_tokens, "problem": lost.message}
    await failover.record("request.poison", deployment, data)
    return PoisonRequest(
        502,
        f"Request {rid} was running on two replicas that were lost under it (replica {first}, then replica "
        f"{second}: {lost.message or 'lost'}); it is not sent to another, since it may be what stops them.",
        code="replicas_lost",
    )


def _no_ready_replica(exc: router.NoReadyReplica) -> GatewayError:
    slug = exc.deployment.slug
    if exc.failed:  # gave up: waiting will not help
        return GatewayError(
            503,
            f"Deployment '{slug}' has failed: {exc.deployment.failed_reason}. It is not retrying; an operator"
            f" must restart it (POST /api/v1/deployments/{slug}/restart/).",
            code="deployment_failed",
        )
    return GatewayError(
        503,
        f"Deployment '{slug}' has no ready replica right now; try again shortly.",
        code="no_ready_replica",
        headers={"Retry-After": "2"},
    )


def session_of(
    deployment: Deployment, req: GenerationRequest, headers: Mapping[str, str] | None, session: str | None
) -> str | None:
    """The request's session key: `prompt_cache_key` in the body, the websocket's `session`, or
    the header the deployment's cache policy names (default `x-session-affinity`)."""
    if req.prompt_cache_key is not None:
        return req.prompt_cache_key
    if session is not None:
        return session
    policy = deployment.cache_policy
    header = policy.session_affinity_header if policy is not None else DEFAULT_SESSION_HEADER
    return session_key((headers or {}).get(header) or None, header)


async def start(
    req: GenerationRequest, caller: Caller, headers: Mapping[str, str] | None = None, session: str | None = None
) -> Generation:
    """Admit `req`: `headers` are the HTTP request's (the session header is read from them),
    `session` a websocket request's session key."""
    hub = get_hub()
    started = time.monotonic()
    trace = tracing.start(req.kind, req.model, req.params.max_tokens, headers)
    try:
        gen = await _start(hub, req, caller, headers, session)
    except Exception as exc:  # refused, or the broker away: the trace ends here, saying why
        tracing.finish(trace, None, None, None, getattr(exc, "message", None) or str(exc))
        raise
    if trace is not None:
        trace.placed(gen.route.replica_id)
    gen.trace, gen.started_mono = trace, started
    return gen


async def _start(hub, req: GenerationRequest, caller: Caller, headers, session) -> Generation:
    if req.priority < caller.min_priority:
        raise GatewayError(
            403,
            f"This API key may not ask for priority {req.priority}: the most urgent it may ask for is "
            f"{caller.min_priority} (service_tier 'priority' is -1; an operator sets the key's min_priority).",
            "priority",
            "priority_not_allowed",
        )
    deployment, candidates = await _deployment_and_replicas(req.model, caller)
    session = session_of(deployment, req, headers, session)
    await tokenization.tokenize(deployment, req)  # the router's ids; refused here if over the context
    prompt_tokens = len(req.prompt_token_ids) if req.prompt_token_ids is not None else None
    limited = caller.key if caller.batch is None else None  # the dispatcher paces a batch
    await ratelimit.check(hub.redis, limited, prompt_tokens)
    prefix = "chatcmpl" if req.kind == "chat" else "cmpl"
    message = req.replica_message()
    message.session_turn = session is not None  # its context begins the next turn: worth sharing (KV store)
    priority = BATCH_PRIORITY if caller.batch is not None else message.share.priority
    message.share = replace(message.share, priority=priority, tenant=caller.tenant, weight=caller.weight)
    # A request of n > 1 choices is not resumed elsewhere (failover.Progress follows one output):
    # a lost replica ends it with a clean error.
    resumable = failover.enabled() and message.params.n == 1
    if resumable and message.prompt_token_ids is None:  # untokenised: to resume it elsewhere, ask for them
        message.return_prompt_token_ids = True
    losses = failover.Losses()
    route, stream, first = await _place(
        hub, deployment, candidates, message, lambda: f"{prefix}-{uuid.uuid4().hex}", session, losses=losses
    )
    if not isinstance(first, AcceptedEvent):
        raise _refusal(req, first)
    losses.request_id = stream.request_id
    if prompt_tokens is not None:  # exact before it runs: a burst cannot overdraw the budget
        await ratelimit.count_tokens(hub.redis, limited, prompt_tokens)
    progress = failover.Progress(message.prompt_token_ids or first.prompt_token_ids) if resumable else None
    return Generation(stream.request_id, deployment, route, stream, caller, prefill_replica=first.prefill_replica,
                      message=message, progress=progress, losses=losses,
                      prompt_counted=prompt_tokens is not None)  # fmt: skip


def _refusal(req: GenerationRequest, event: ErrorEvent) -> GatewayError:
    """A replica's refusal at admission. A 4xx names the parameter the replica found at fault
    (its messages are written for clients); anything else is the replica failing, reported
    without its internals."""
    status = event.status
    if 400 <= status < 500:
        code = event.code or "invalid_value"
        # No `param`: only a context error is surely the prompt's. Sent as ids, a chat's prompt is
        # `prompt` to the replica; to the client it is `messages`.
        prompt = "messages" if req.kind == "chat" else "prompt"
        param = prompt if event.param == "prompt" else event.param
        param = param or (prompt if code == "context_length_exceeded" else None)
        return GatewayError(status, event.message or "The replica refused the request.", param, code)
    if event.code == ENGINE_ERROR:
        return GatewayError(500, event.message or "the engine failed on this request", code=ENGINE_ERROR)
    return GatewayError(502, "The replica failed to admit the request; retry it.", code="replica_error")
