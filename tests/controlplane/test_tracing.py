"""Per-request traces (controlplane/gateway/tracing.py), read from an in-memory exporter: one trace
per request, joining the client's `traceparent`, with the GenAI attributes and the phases the
replica reported as child spans, in order; none at all while tracing is off."""

from __future__ import annotations

import time

import pytest
import redis
from django.conf import settings
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from controlplane.gateway import tracing
from controlplane.gateway.services import create_api_key
from tests.controlplane.test_session_turns import CHAT, serve
from tests.support.played_replica import played_replica
from workers.protocol.replica import DeltaEvent

pytestmark = pytest.mark.django_db
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def answer(rid: str, _n: int) -> list:
    """The replica's answer after the 40 ms it reports having spent (queue 10, prefill 20, ...):
    its phases end when the gateway sees them, so they must fit in the time that passed."""
    time.sleep(0.04)  # the replica's work, modelled: not a wait for anything
    usage = {"prompt_tokens": 12, "completion_tokens": 5, "cached_tokens": 8}
    timings = {"ttft_ms": 30.0, "total_ms": 30.0, "queue_ms": 10.0, "prefill_ms": 20.0, "decode_ms": 0.0}
    return [DeltaEvent(rid, "hello", [1, 2, 3, 4, 5], finish_reason="stop", usage=usage, timings=timings)]


@pytest.fixture
def exporter():
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.use_provider(provider)
    yield spans
    tracing.use_provider(None)


@pytest.fixture
def key(django_user_model):
    return create_api_key(name="k", owner=django_user_model.objects.create_user("traced"))[1]


def post(client, key: str, **headers):
    extra = {f"HTTP_{k.upper()}": v for k, v in headers.items()}
    return client.post(
        "/v1/chat/completions", CHAT, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}", **extra
    )


def test_a_request_is_one_trace_joining_the_clients_with_its_phases_in_order(client, key, exporter):
    replica = serve()
    rc = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    with played_replica(rc, replica, answer=answer):
        response = post(client, key, traceparent=f"00-{TRACE_ID}-{PARENT_ID}-01")
    assert response.status_code == 200, response.content
    spans = exporter.get_finished_spans()
    assert {format(s.context.trace_id, "032x") for s in spans} == {TRACE_ID}  # the client's trace
    [root] = [s for s in spans if s.name == "chat turns"]
    assert format(root.parent.span_id, "016x") == PARENT_ID
    attrs = dict(root.attributes)
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"] == "turns"
    assert attrs["gen_ai.usage.input_tokens"] == 12 and attrs["gen_ai.usage.output_tokens"] == 5
    assert attrs["gen_ai.response.id"] == response.json()["id"] and attrs["switchyard.replica"] == replica
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    children = sorted(
        (s for s in spans if s.parent and s.parent.span_id == root.context.span_id), key=lambda s: s.start_time
    )
    assert [s.name for s in children] == ["queue", "prefill", "decode"]
    queue, prefill, decode = children
    assert queue.end_time == prefill.start_time and prefill.end_time == decode.start_time
    assert (prefill.end_time - prefill.start_time) == pytest.approx(20e6, abs=1e3)  # 20 ms, as reported
    assert (queue.end_time - queue.start_time) == pytest.approx(10e6, abs=1e3)
    assert dict(prefill.attributes)["switchyard.cached_tokens"] == 8
    assert root.start_time <= queue.start_time and decode.end_time <= root.end_time


def test_a_refused_request_ends_its_trace_with_the_error(client, key, exporter):
    response = client.post(
        "/v1/chat/completions",
        {**CHAT, "model": "nowhere"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert response.status_code == 404
    [span] = exporter.get_finished_spans()
    assert span.status.status_code.name == "ERROR" and "does not exist" in span.status.description


def test_tracing_is_off_without_an_endpoint(client, key, monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    tracing.use_provider(None)
    monkeypatch.setattr(tracing, "_configured", False)
    assert not tracing.enabled()
    assert tracing.start("chat", "m", 4, {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}) is None


class Clock:
    """time.monotonic() for tracing.py, moved by the test: the spans' times are then exact."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    @staticmethod
    def time_ns() -> int:
        return time.time_ns()


def test_a_request_that_moved_has_each_replica_s_phases_and_the_hop_between(exporter, monkeypatch):
    """Built from the events alone: replica 1 reports queue 10 ms, prefill 30 ms (of which 5 ms
    KV transfer) with its first token at +50 ms, and is lost at +150 ms; replica 2 takes the
    request at +200 ms and reports its own phases with its first token at +300 ms; it ends at
    +400 ms."""
    clock = Clock()
    monkeypatch.setattr(tracing, "time", clock)
    rt = tracing.start("chat", "m", 64, None)
    rt.placed(1)
    ms = 1e-3

    def delta(at_ms: float, **fields) -> None:
        clock.now = 100.0 + at_ms * ms
        rt.observe(DeltaEvent("r", "x", [1], **fields))

    delta(50, timings={"queue_ms": 10.0, "prefill_ms": 30.0}, disaggregation={"prefill": {"transfer_ms": 5.0}})
    delta(100)
    clock.now = 100.2
    rt.moved({"from_replica": 1, "to_replica": 2, "after_tokens": 2}, lost_at=100.15)
    delta(300, timings={"queue_ms": 20.0, "prefill_ms": 50.0})
    final = DeltaEvent(
        "r",
        "",
        [2],
        finish_reason="length",
        usage={"prompt_tokens": 7, "completion_tokens": 4, "cached_tokens": 3},
        timings={"queue_ms": 20.0, "prefill_ms": 50.0, "decode_ms": 90.0},
    )
    delta(390, **{f: getattr(final, f) for f in ("finish_reason", "usage", "timings")})
    clock.now = 100.4
    tracing.finish(rt, "r", 2, final)

    spans = exporter.get_finished_spans()
    [root] = [s for s in spans if s.parent is None]
    children = sorted((s for s in spans if s.parent is not None), key=lambda s: (s.start_time, s.end_time))
    at = lambda ns: round((ns - root.start_time) / 1e6, 3)  # noqa: E731  ms after the request's start
    drawn = [(s.name, dict(s.attributes).get("switchyard.replica"), at(s.start_time), at(s.end_time)) for s in children]
    assert drawn == [
        ("queue", 1, 10.0, 20.0),
        ("prefill", 1, 20.0, 50.0),
        ("kv_transfer", 1, 45.0, 50.0),
        ("decode", 1, 50.0, 150.0),
        ("failover", None, 150.0, 200.0),
        ("queue", 2, 230.0, 250.0),
        ("prefill", 2, 250.0, 300.0),
        ("decode", 2, 300.0, 400.0),
    ]
    hop = children[4]
    assert dict(hop.attributes) == {
        "switchyard.from_replica": 1,
        "switchyard.to_replica": 2,
        "switchyard.after_tokens": 2,
    }
    assert dict(children[6].attributes)["switchyard.cached_tokens"] == 3  # known where it ended
    assert "switchyard.cached_tokens" not in dict(children[1].attributes)
    attrs = dict(root.attributes)
    assert attrs["switchyard.ttft_ms"] == 50.0 and attrs["gen_ai.usage.output_tokens"] == 4
    assert at(root.end_time) == 400.0
