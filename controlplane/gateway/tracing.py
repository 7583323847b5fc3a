"""Per-request traces (OpenTelemetry, the GenAI semantic conventions), off unless
OTEL_EXPORTER_OTLP_ENDPOINT is set: then each request is one trace, exported over OTLP/HTTP.

The gateway's span (`chat <model>`, kind server) joins the client's trace when it sends a W3C
`traceparent`. Its children are the request's phases as the replica timed them and reported on
its final event (`timings`: its grammar's compilation, queue, prefill, decode; a disaggregated
request's KV transfer) and
each move to another replica (`failover`): the gateway writes them with their times when the
request ends, so a replica needs no tracing library and no exporter of its own. Attributes:
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
class RequestTrace:
    """The gateway's span of one request, and what its children are made of at its end."""

    span: object
    tracer: object
    started_ns: int
    started_mono: float
    hops: list[dict] = field(default_factory=list)

    def at(self, mono: float) -> int:
        """A time.monotonic() reading as the span's clock (ns since the epoch)."""
        return self.started_ns + int((mono - self.started_mono) * 1e9)


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
    span = tracer.start_span(f"{operation} {model}", context=context, kind=trace.SpanKind.SERVER,
                             start_time=started_ns)  # fmt: skip
    span.set_attribute("gen_ai.operation.name", operation)
    span.set_attribute("gen_ai.request.model", model)
    if max_tokens is not None:
        span.set_attribute("gen_ai.request.max_tokens", max_tokens)
    return RequestTrace(span, tracer, started_ns, started_mono)


def finish(rt: RequestTrace | None, request_id: str | None, replica: int | None, final, first_token_at: float | None,
           error: str | None = None) -> None:  # fmt: skip
    """End the request's span (`final`: its last DeltaEvent, None if it failed), its phases as
    the replica reported them, ending at the moments the gateway saw them."""
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

    for hop in rt.hops:  # each move to another replica, at the moment it was made
        child("failover", hop["at"], hop["at"], **{"switchyard.from_replica": hop["from_replica"],
                                                   "switchyard.to_replica": hop["to_replica"],
                                                   "switchyard.after_tokens": hop["after_tokens"]})  # fmt: skip
    timings = (getattr(final, "timings", None) or {}) if final is not None else {}
    if final is not None and first_token_at is not None and "prefill_ms" in timings:
        prefill_start = first_token_at - timings["prefill_ms"] / 1000
        queue_start = prefill_start - timings.get("queue_ms", 0) / 1000
        transfer = ((getattr(final, "disaggregation", None) or {}).get("prefill") or {}).get("transfer_ms")
        if "grammar_ms" in timings:  # compiled at admission, before it queued
            child("grammar", queue_start - timings["grammar_ms"] / 1000, queue_start)
        child("queue", queue_start, prefill_start)
        if transfer is not None:  # a prefill replica computed the prompt and sent its KV
            child("kv_transfer", first_token_at - transfer / 1000, first_token_at)
        usage = final.usage or {}
        child("prefill", prefill_start, first_token_at, **{"switchyard.cached_tokens": usage.get("cached_tokens", 0)})
        child("decode", first_token_at, now)
    if final is not None and final.usage:
        span.set_attribute("gen_ai.usage.input_tokens", final.usage.get("prompt_tokens", 0))
        span.set_attribute("gen_ai.usage.output_tokens", final.usage.get("completion_tokens", 0))
        span.set_attribute("gen_ai.response.finish_reasons", [final.finish_reason or "stop"])
    if first_token_at is not None:
        span.set_attribute("switchyard.ttft_ms", round((first_token_at - rt.started_mono) * 1000, 3))
    if error:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=rt.at(now))
