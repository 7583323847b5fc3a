"""The gateway <-> replica contract (workers.protocol.replica): every message survives the wire
unchanged, a newer version is refused by name, fields this side does not know are ignored, and
what the gateway sends for a chat or completion request is what the replica reads."""

from __future__ import annotations

import asyncio
import json
from dataclasses import fields, replace

import pytest
import redis
from django.conf import settings

from workers.engine.errors import RequestError
from workers.engine.sampling_params import SamplingParams
from workers.protocol import replica as protocol
from workers.protocol.replica import (
    AbortMessage,
    AcceptedEvent,
    DeltaEvent,
    ErrorEvent,
    GenerateMessage,
    KVTiersSpec,
    MessageError,
    PrefilledMessage,
    PrefillFailedMessage,
    PrefillMessage,
    ReplicaSpec,
    ReplicaStatus,
    Resume,
    SpeculativeSpec,
    WireSamplingParams,
    read_event,
)
from workers.protocol.wire import ProtocolError

PARAMS = WireSamplingParams(temperature=0.0, top_p=0.9, top_k=5, min_p=0.1, presence_penalty=0.5,
                            frequency_penalty=-0.5, repetition_penalty=1.1, seed=7, max_tokens=9,
                            stop=["END"], ignore_eos=True, logprobs=2)  # fmt: skip
LOGPROBS = [{"id": 5, "token": "a", "logprob": -0.1, "top": [{"id": 5, "token": "a", "logprob": -0.1}]}]

MESSAGES = {
    "chat": GenerateMessage("chatcmpl-1", "gw:1", PARAMS, messages=[{"role": "user", "content": "hi"}],
                            tools=[{"type": "function", "function": {"name": "f"}}], return_prompt_token_ids=True),
    "text": GenerateMessage("cmpl-1", "gw:1", prompt="Once"),
    "session-turn": GenerateMessage("chatcmpl-2", "gw:1", PARAMS, prompt_token_ids=[1, 2], session_turn=True),
    "resumed": GenerateMessage("cmpl-1-r1.0", "gw:1", PARAMS, prompt_token_ids=[1, 2, 3, 4],
                               prefill_replica=3, resume=Resume(output_tokens=2, text_sent=5)),
    "abort": AbortMessage("cmpl-1"),
    "accepted": AcceptedEvent("cmpl-1", 4, prompt_token_ids=[1, 2, 3, 4], prefill_replica=3),
    "accepted-plain": AcceptedEvent("cmpl-1", 4),
    "delta": DeltaEvent("cmpl-1", "Hé", [7], t=1700000000.123456),
    "delta-logprobs": DeltaEvent("cmpl-1", "a", [5], t=1.5, logprobs=LOGPROBS),
    "delta-first": DeltaEvent("cmpl-1", "a", [5], t=1.5, timings={"queue_ms": 1.0, "prefill_ms": 2.5},
                              disaggregation={"prefill": {"replica": 3, "transfer_ms": 0.5}}),
    "delta-last": DeltaEvent("cmpl-1", "", [2], t=1.5, finish_reason="stop", stop_reason=2,
                             usage={"prompt_tokens": 4, "completion_tokens": 3, "cached_tokens": 0},
                             timings={"ttft_ms": 1.5, "total_ms": 9.25},
                             disaggregation={"prefill": {"replica": 3, "transfer_ms": 0.5}}),
    "error": ErrorEvent("cmpl-1", 400, "seed must be in [0, 2**64-1]", "seed", "invalid_value"),
    "error-plain": ErrorEvent("cmpl-1", 503, "replica is draining"),
    "prefill": PrefillMessage("cmpl-1", [1, 2, 3], PARAMS, {"session": "h:1", "layout": {"block_size": 16}},
                              [4, 5], "switchyard:replica:2:requests", 1700000000.5),
    "prefill-turn": PrefillMessage("cmpl-1", [1, 2, 3], PARAMS, {"session": "h:1"}, [4], "s", 1.5, session_turn=True),
    "prefilled": PrefilledMessage("cmpl-1", 9, {"9": -0.25}, cached_tokens=16, bytes=4096, transfer_ms=1.25),
    "prefill-failed": PrefillFailedMessage("cmpl-1", "layout mismatch: block_size"),
}  # fmt: skip


def _wire(message) -> dict:
    """As the other side receives it: encoded, sent, decoded."""
    return protocol.decode(protocol.encode(message.to_wire()))


@pytest.mark.parametrize("name", MESSAGES)
def test_every_message_survives_the_wire(name):
    message = MESSAGES[name]
    assert type(message).from_wire(_wire(message)) == message


@pytest.mark.parametrize("name", [n for n, m in MESSAGES.items() if type(m) in protocol.EVENTS.values()])
def test_an_event_is_read_by_its_type(name):
    assert read_event(_wire(MESSAGES[name])) == MESSAGES[name]


def test_the_wire_keeps_its_shape():
    """The JSON both ends have always exchanged, plus `version`."""
    assert MESSAGES["resumed"].to_wire() == {
        "type": "generate",
        "id": "cmpl-1-r1.0",
        "reply_to": "gw:1",
        "version": 1,
        "params": PARAMS.to_wire(),
        "prompt_token_ids": [1, 2, 3, 4],
        "prefill": {"replica_id": 3},
        "resume": {"output_tokens": 2, "text_sent": 5},
    }
    assert MESSAGES["delta"].to_wire() == {"type": "delta", "id": "cmpl-1", "version": 1, "text": "Hé",
                                           "token_ids": [7], "t": 1700000000.123456}  # fmt: skip
    last = MESSAGES["delta-last"].to_wire()
    assert {"finish_reason", "stop_reason", "usage", "timings", "disaggregation"} <= set(last)
    assert MESSAGES["error-plain"].to_wire() == {
        "type": "error",
        "id": "cmpl-1",
        "version": 1,
        "status": 503,
        "message": "replica is draining",
    }


@pytest.mark.parametrize("name", MESSAGES)
def test_a_newer_version_is_refused_by_name(name):
    message = MESSAGES[name]
    with pytest.raises(ProtocolError, match=rf"{type(message).__name__} version 2 is newer than this side's 1"):
        type(message).from_wire({**_wire(message), "version": 2})


@pytest.mark.parametrize("name", MESSAGES)
def test_fields_this_side_does_not_know_are_ignored(name):
    message = MESSAGES[name]
    assert type(message).from_wire({**_wire(message), "priority": "high", "trace": {"id": 1}}) == message


def test_a_message_without_a_version_is_this_sides():
    """Older senders and hand-written messages (tests, tools) carry none."""
    data = {"type": "generate", "id": "x", "reply_to": "c", "prompt_token_ids": [1], "params": {"max_tokens": 2}}
    assert GenerateMessage.from_wire(data) == GenerateMessage(
        "x", "c", WireSamplingParams(max_tokens=2), prompt_token_ids=[1]
    )


def test_status_hash_round_trip_and_version():
    status = ReplicaStatus(
        "ready",
        1700000000.125,
        "abc123",
        load={"running": 1, "waiting": 0},
        endpoint={"stream": "s", "pid": 42, "max_model_len": 512},
        metrics={"requests_finished": 3},
    )
    raw = status.to_hash()
    assert all(isinstance(v, str) for v in raw.values())
    assert ReplicaStatus.from_hash(raw) == status
    assert ReplicaStatus.from_hash({**raw, "colour": "blue"}) == status
    with pytest.raises(ProtocolError, match="ReplicaStatus version 2 is newer"):
        ReplicaStatus.from_hash({**raw, "version": "2"})
    loading = ReplicaStatus("loading", 5.0, progress={"stage": "loading weights", "fraction": 0.5}).to_hash()
    assert set(loading) == {"state", "heartbeat", "version", "progress"}  # nothing of the earlier process overwritten
    assert ReplicaStatus.from_hash({}) == ReplicaStatus() and not ReplicaStatus().is_fresh()
    garbled = ReplicaStatus.from_hash({"state": "ready", "load": "{nope", "heartbeat": "x"})
    assert (garbled.load, garbled.heartbeat) == ({}, 0.0)
    assert status.is_fresh(now=status.heartbeat + 1) and not status.is_fresh(now=status.heartbeat + 60)


def test_replica_spec_round_trip_and_version():
    spec = ReplicaSpec(replica_id=3, deployment="d", model_dir="/m", model_name="m", role="decode", cuda_devices=[2, 3])
    assert ReplicaSpec.from_json(spec.to_json()) == spec
    data = json.loads(spec.to_json())
    assert ReplicaSpec.from_json(json.dumps({**data, "future": True})) == spec
    with pytest.raises(ProtocolError, match="ReplicaSpec version 3 is newer"):
        ReplicaSpec.from_json(json.dumps({**data, "version": 3}))
    with pytest.raises(ProtocolError, match="version must be an integer"):
        ReplicaSpec.from_json(json.dumps({**data, "version": "2"}))


def test_a_version_1_replica_spec_is_read_with_its_old_names():
    """An agent restarted onto a newer release adopts replicas from the spec files the old one
    wrote: `model` was the model directory and `extra` carried the CUDA devices."""
    old = {"replica_id": 3, "deployment": "d", "model": "/m", "model_name": "m", "extra": {"cuda_devices": [1]},
           "version": 1}  # fmt: skip
    spec = ReplicaSpec.from_wire(old)
    assert (spec.model_dir, spec.model_name, spec.cuda_devices, spec.version) == ("/m", "m", [1], 2)
    assert ReplicaSpec.from_wire({**old, "extra": {}}).cuda_devices == []
    # A version 2 sender's `model` is not the directory: without `model_dir` the spec is refused.
    with pytest.raises(ProtocolError, match="model_dir"):
        ReplicaSpec.from_wire({**old, "version": 2})
    # A nested message is read back as its class (Wire's from_wire reads fields typed as one).
    drafting = ReplicaSpec(3, "d", "/m", "m", speculative=SpeculativeSpec("eagle3", 3, "/heads/h"))
    back = ReplicaSpec.from_json(drafting.to_json())
    assert back == drafting and isinstance(back.speculative, SpeculativeSpec)
    assert back.speculative.engine_config() == {"method": "eagle3", "num_speculative_tokens": 3, "model": "/heads/h"}


def test_a_replica_spec_with_kv_tiers_round_trips_and_gives_the_engine_what_is_set():
    tiers = KVTiersSpec(dram_bytes=1 << 30, disk_path="/var/cache/kv", disk_bytes=8 << 30,
                        store_master="10.0.0.5:50051", min_prefix_tokens=256, local_hostname="10.0.0.12",
                        store_protocol="rdma", store_segment_bytes=512 << 20)  # fmt: skip
    spec = ReplicaSpec(3, "d", "/m", "m", kv_tiers=tiers)
    back = ReplicaSpec.from_json(spec.to_json())
    assert back == spec and isinstance(back.kv_tiers, KVTiersSpec)
    assert back.kv_tiers.engine_config() == {
        "dram_bytes": 1 << 30,
        "disk_path": "/var/cache/kv",
        "disk_bytes": 8 << 30,
        "store_master": "10.0.0.5:50051",
        "min_prefix_tokens": 256,
        "local_hostname": "10.0.0.12",
        "store_protocol": "rdma",
        "store_segment_bytes": 512 << 20,
    }
    # Unset fields keep the engine's defaults; a spec without tiers says so.
    assert KVTiersSpec(dram_bytes=4096).engine_config() == {"dram_bytes": 4096}
    assert ReplicaSpec.from_json(ReplicaSpec(3, "d", "/m", "m").to_json()).kv_tiers is None


def test_a_generate_says_session_turn_only_when_it_is_one():
    assert "session_turn" not in MESSAGES["text"].to_wire()
    assert MESSAGES["session-turn"].to_wire()["session_turn"] is True
    # Anything but true is not a turn (a sender cannot make one by accident).
    for value in ("yes", 1, None):
        data = {**MESSAGES["session-turn"].to_wire(), "session_turn": value}
        assert GenerateMessage.from_wire(data).session_turn is False


# -- reading a generate: what the replica answers with a 400 naming the parameter --------------
@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"params": ["not", "a", "dict"]}, "params"),
        ({"params": {"best_of": 3}}, "best_of"),
        ({"prompt_token_ids": ["x"]}, "prompt"),
        ({"prompt_token_ids": [True]}, "prompt"),
        ({"prompt_token_ids": "1 2"}, "prompt"),
        ({"prompt": 5, "prompt_token_ids": None}, "prompt"),
        ({"messages": {"role": "user"}}, "messages"),
        ({"tools": "f"}, "tools"),
        ({"resume": [2]}, "resume"),
        ({"resume": {"output_tokens": "1"}}, "resume"),
        ({"resume": {"output_tokens": 1, "text_sent": -1}}, "resume"),
    ],
)
def test_a_malformed_generate_names_the_parameter(change, param):
    data = {**_wire(MESSAGES["resumed"]), "resume": None, **change}
    with pytest.raises(MessageError) as err:
        GenerateMessage.from_wire(data)
    assert err.value.param == param


def test_sampling_parameters_are_checked_first_and_by_the_engine():
    """Shapes here, values in SamplingParams: a bad value in a well-formed message reads, then
    the engine names it (the order the replica has always answered in)."""
    data = {
        "id": "x",
        "reply_to": "c",
        "messages": [{"role": "user", "content": {"nested": 1}}],
        "params": {"temperature": -1},
    }
    message = GenerateMessage.from_wire(data)
    with pytest.raises(RequestError) as err:
        SamplingParams.from_wire(message.params)
    assert err.value.param == "temperature"
    with pytest.raises(MessageError) as err:  # an unknown name before a malformed prompt
        GenerateMessage.from_wire({**data, "params": {"best_of_all": 2}, "prompt_token_ids": "x"})
    assert err.value.param == "best_of_all"


def test_a_generate_nobody_can_be_answered_for_is_a_protocol_error():
    for data in ({"reply_to": "c"}, {"id": "x"}, {"id": 5, "reply_to": "c"}, ["generate"]):
        with pytest.raises(ProtocolError) as err:
            GenerateMessage.from_wire(data)
        assert not isinstance(err.value, MessageError)


def test_a_malformed_prefill_hint_is_ignored():
    base = _wire(MESSAGES["text"])
    for prefill in (["not", "a", "dict"], {"replica_id": "3"}, {"replica_id": True}, {}):
        assert GenerateMessage.from_wire({**base, "prefill": prefill}).prefill_replica is None


def test_wire_sampling_params_are_the_engines_defaults_and_fields():
    engine = SamplingParams()
    for f in fields(WireSamplingParams):
        assert f.name in SamplingParams.__dataclass_fields__, f.name
        assert getattr(WireSamplingParams(), f.name) == getattr(engine, f.name), f.name
    built = SamplingParams.from_wire(PARAMS)  # every field carried over, none left behind
    assert {f.name: getattr(built, f.name) for f in fields(WireSamplingParams)} == PARAMS.to_wire()


def test_unreadable_events_are_protocol_errors():
    for data in (
        {"type": "telemetry", "id": "x"},
        {"type": ["delta"]},
        "delta",
        {"type": "delta"},
        {"type": "accepted", "id": "x"},
    ):
        with pytest.raises(ProtocolError):
            read_event(data)


# -- the gateway's message is the replica's -----------------------------------------------------
REPLICA = 9301


@pytest.mark.parametrize("kind", ["chat", "completion", "completion-ids"])
def test_what_the_gateway_sends_is_what_the_replica_reads(kind):
    """Through the gateway's own code (parser, hub) and real Redis, read back as the replica
    reads its stream."""
    from controlplane.gateway.dialects.openai.request import parse_chat, parse_completion
    from controlplane.gateway.hub import ReplicaHub

    common = {"model": "m", "temperature": 0.5, "top_k": 4, "seed": 11, "max_tokens": 7, "stop": "\n",
              "presence_penalty": 0.25, "ignore_eos": True}  # fmt: skip
    if kind == "chat":
        tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
        req = parse_chat({**common, "messages": [{"role": "developer", "content": "be brief"},
                                                 {"role": "user", "content": "hi"}],
                          "tools": tools, "logprobs": True, "top_logprobs": 2})  # fmt: skip
    else:
        req = parse_completion({**common, "prompt": "Once" if kind == "completion" else [5, 6, 7], "logprobs": 1})
    message = replace(req.replica_message(), return_prompt_token_ids=True, prefill_replica=2)
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    client.delete(protocol.requests_key(REPLICA))

    async def send() -> str:
        hub = ReplicaHub(settings.REDIS_URL)
        try:
            await hub.submit(REPLICA, f"{kind}-1", message, None)
            return hub.channel
        finally:
            tasks = [t for t in (hub._listener, hub._refresher) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await hub.redis.aclose()

    channel = asyncio.run(send())
    ((_, entry),) = client.xrange(protocol.requests_key(REPLICA))
    read = GenerateMessage.from_wire(protocol.decode(entry["m"]))  # what ReplicaServer._admit reads
    assert read == replace(message, id=f"{kind}-1", reply_to=channel)
    assert read.chat == (kind == "chat") and read.prefill_replica == 2
    params = SamplingParams.from_wire(read.params)
    assert (params.temperature, params.top_k, params.seed, params.max_tokens, params.stop) == (0.5, 4, 11, 7, ["\n"])
    assert (params.presence_penalty, params.ignore_eos, params.logprobs) == (0.25, True, 2 if kind == "chat" else 1)
    if kind == "chat":
        assert read.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
        assert read.tools == req.tools
    client.delete(protocol.requests_key(REPLICA))
