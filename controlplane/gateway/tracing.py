"""Per-request traces (OpenTelemetry, the GenAI semantic conventions), off unless
OTEL_EXPORTER_OTLP_ENDPOINT is set: then each request is one trace, exported over OTLP/HTTP.

The gateway's span (`chat <model>`, kind server) joins the client's trace when it sends a W3C
`traceparent`. Its children are the request's phases on each replica that served it, as the
replica timed them and reported with its first token and its last (`timings`: the grammar's
compilation, queue, prefill; a disaggregated request's KV transfer), its decode there until it
ended or the replica was lost, and each move to another replica (`failover`). The gateway writes
them with their times when the request ends, so a replica needs no tracing library and no
exporter of its own. Attributes:
`gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.request.max_tokens`,
`gen_ai.response.id`, `gen_ai.response.finish_reasons`, `gen_ai.usage.input_tokens` /
`output_tokens`, and `switchyard.*` (replica, cached tokens, TTFT).

When tracing is off nothing here runs: `start` returns None and the request carries no span.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

_provider = None  # the TracerProvider in use (None: tracing is off)
_configured = False


def _setup() -> None:
    """The OTLP exporter, once, if OTEL_EXPORTER_OTLP_ENDPOINT is set (the SDK reads it and the
    other OTEL_* variables itself)."""
    global _provider, _configured
    _configured = True
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    service = os.environ.get("OTEL_SERVICE_NAME", "switchyard-gateway")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _provider = provider
    log.info("tracing requests to %s", os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"])


def use_provider(provider) -> None:
    """Trace with `provider` (tests: one with an in-memory exporter); None turns tracing off."""
    global _provider, _configured
    _provider, _configured = provider, True


def enabled() -> bool:
    if not _configured:
        _setup()
    return _provider is not None


@dataclass
class Leg:
    """The request's time on one replica: its phases there as the replica reported them with its
    first token (and again with its last), until the request ended or moved on."""

    replica: int
    first_token_at: float | None = None  # when the gateway saw its first token from this replica
    timings: dict = field(default_factory=dict)  # queue_ms, prefill_ms, grammar_ms
    transfer_ms: float | None = None  # a prefill replica computed its prompt and sent the KV
    cached_tokens: int | None = None  # known when it ended here

    def observe(self, event, now: float) -> None:
        if self.first_token_at is None:
            self.first_token_at = now
        for name, value in (event.timings or {}).items():
            self.timings.setdefault(name, value)
        prefill = (event.disaggregation or {}).get("prefill") or {}
        if prefill.get("transfer_ms") is not None:
            self.transfer_ms = prefill["transfer_ms"]
        if event.usage:
            self.cached_tokens = event.usage.get("cached_tokens", 0)


@dataclass
class RequestTrace:
    """The gateway's span of one request, and what its children are made of at its end: one leg
    per replica that served it, and each move between them (`hops`)."""

    span: object
    tracer: object
    started_ns: int
    started_mono: float
    legs: list[Leg] = field(default_factory=list)
    hops: list[dict] = field(default_factory=list)

    def at(self, mono: float) -> int:
        """A time.monotonic() reading as the span's clock (ns since the epoch)."""
        return self.started_ns + int((mono - self.started_mono) * 1e9)

    def placed(self, replica: int) -> None:
        self.legs.append(Leg(replica))

    def observe(self, event) -> None:
        """A delta event from the replica serving it now (placed() named the first)."""
        self.legs[-1].observe(event, time.monotonic())

    def moved(self, note: dict, lost_at: float) -> None:
        """It was lost at `lost_at` and now runs on `note["to_replica"]`."""
        self.hops.append({**note, "lost_at": lost_at, "at": time.monotonic()})
        self.legs.append(Leg(note["to_replica"]))


def start(kind: str, model: str, max_tokens: int | None, headers: Mapping[str, str] | None) -> RequestTrace | None:
    if not enabled():
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {k.lower(): v for k, v in (headers or {}).items() if k.lower() in ("traceparent", "tracestate")}
    context = TraceContextTextMapPropagator().extract(carrier) if carrier else None
    tracer = _provider.get_tracer("switchyard.gateway")
    operation = "chat" if kind == "chat" else "text_completion"
    started_ns, started_mono = time.time_ns(), time.monotonic()
    span = tracer.start_span(f"{operation} {model}", context=context, kind=trace.SpanKind.SERVER, start_time=started_ns)
    span.set_attribute("gen_ai.operation.name", operation)
    span.set_attribute("gen_ai.request.model", model)
    if max_tokens is not None:
        span.set_attribute("gen_ai.request.max_tokens", max_tokens)
    return RequestTrace(span, tracer, started_ns, started_mono)


def finish(
    rt: RequestTrace | None, request_id: str | None, replica: int | None, final, error: str | None = None
) -> None:
    """End the request's span (`final`: its last DeltaEvent, None if it failed) with a child for
    each phase on each replica that served it, ending at the moments the gateway saw them, and
    one for each move between replicas."""
    if rt is None:
        return
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode

    now = time.monotonic()
    span = rt.span
    if request_id:
        span.set_attribute("gen_ai.response.id", request_id)
    if replica is not None:
        span.set_attribute("switchyard.replica", replica)
    context = trace.set_span_in_context(span)

    def child(name: str, start_mono: float, end_mono: float, **attributes) -> None:
        start_mono = max(start_mono, rt.started_mono)
        child_span = rt.tracer.start_span(name, context=context, start_time=rt.at(start_mono), attributes=attributes)
        child_span.end(end_time=rt.at(max(end_mono, start_mono)))

    for i, leg in enumerate(rt.legs):
        hop = rt.hops[i] if i < len(rt.hops) else None
        _leg_spans(child, leg, hop["lost_at"] if hop else now)
        if hop is not None:  # from the moment the replica was seen lost to the next one taking it
            moved = {f"switchyard.{name}": hop[name] for name in ("from_replica", "to_replica", "after_tokens")}
            child("failover", hop["lost_at"], hop["at"], **moved)
    if final is not None and final.usage:
        span.set_attribute("gen_ai.usage.input_tokens", final.usage.get("prompt_tokens", 0))
        span.set_attribute("gen_ai.usage.output_tokens", final.usage.get("completion_tokens", 0))
        span.set_attribute("gen_ai.response.finish_reasons", [final.finish_reason or "stop"])
    first_token_at = next((leg.first_token_at for leg in rt.legs if leg.first_token_at is not None), None)
    if first_token_at is not None:
        span.set_attribute("switchyard.ttft_ms", round((first_token_at - rt.started_mono) * 1000, 3))
    if error:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=rt.at(now))


def _leg_spans(child, leg: Leg, ended: float) -> None:
    """A leg's phases, drawn back from its first token by the times its replica reported; its
    decode runs until it `ended` (the request's end, or the replica's loss). A leg lost before
    its first token has none."""
    first = leg.first_token_at
    if first is None:
        return
    where = {"switchyard.replica": leg.replica}
    timings = leg.timings
    if "prefill_ms" in timings:
        prefill_start = first - timings["prefill_ms"] / 1000
        queue_start = prefill_start - timings.get("queue_ms", 0) / 1000
        if "grammar_ms" in timings:  # compiled at admission, before it queued
            child("grammar", queue_start - timings["grammar_ms"] / 1000, queue_start, **where)
        child("queue", queue_start, prefill_start, **where)
        if leg.transfer_ms is not None:  # a prefill replica computed the prompt and sent its KV
            child("kv_transfer", first - leg.transfer_ms / 1000, first, **where)
        cached = {"switchyard.cached_tokens": leg.cached_tokens} if leg.cached_tokens is not None else {}
        child("prefill", prefill_start, first, **where, **cached)
    child("decode", first, ended, **where)
