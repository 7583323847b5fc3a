"""The gateway's side of a resume: what it keeps of a request and the replica message that
continues it; the failover counters as /metrics shows them (real Redis). The resumes themselves,
through real replica processes, are in tests/integration/test_failover.py."""

from prometheus_client.parser import text_string_to_metric_families

from controlplane.common import redis as redis_client
from controlplane.gateway import failover
from controlplane.telemetry.prometheus import render
from workers.protocol.replica import DeltaEvent, GenerateMessage, Resume, WireSamplingParams

CHAT = GenerateMessage(
    params=WireSamplingParams(temperature=0.0, max_tokens=32, stop=["\n\n"]),
    return_prompt_token_ids=True,
    messages=[{"role": "user", "content": "hi"}],
    tools=[{"type": "function"}],
)


def test_a_request_that_generated_nothing_is_sent_again_as_it_was():
    progress = failover.Progress(prompt_ids=None)
    assert progress.can_resume() and progress.message(CHAT) == CHAT


def test_a_resumed_request_is_its_prompt_and_output_ids_with_what_the_client_has():
    progress = failover.Progress(prompt_ids=[1, 2, 3, 4])
    for event in (DeltaEvent("r", "Hé", [7]), DeltaEvent("r", "", [8]), DeltaEvent("r", "llo", [9])):
        progress.observe(event)
    message = progress.message(CHAT)
    # Token ids, never the chat again (its template would be rendered a second time); the
    # sampling parameters unchanged (the replica counts the resumed tokens against max_tokens).
    assert message == GenerateMessage(
        params=CHAT.params, prompt_token_ids=[1, 2, 3, 4, 7, 8, 9], resume=Resume(output_tokens=3, text_sent=5)
    )
    assert message.to_wire() == {"type": "generate", "id": "", "reply_to": "", "version": 1,
                                 "params": CHAT.params.to_wire(), "prompt_token_ids": [1, 2, 3, 4, 7, 8, 9],
                                 "resume": {"output_tokens": 3, "text_sent": 5}}  # fmt: skip


def test_resumes_are_limited_and_need_the_prompt_ids():
    progress = failover.Progress(prompt_ids=None)
    progress.observe(DeltaEvent("r", "x", [7]))
    assert not progress.can_resume()  # output, and no prompt ids to put before it
    progress = failover.Progress(prompt_ids=[1])
    progress.resumed = [{}] * failover.MAX_RESUMES
    assert not progress.can_resume()


def test_failover_counts_are_prometheus_counters_per_deployment(db):
    client = redis_client.client()
    client.delete(failover.COUNTS_KEY)
    client.hincrby(failover.COUNTS_KEY, "chat-a:resumed", 3)
    client.hincrby(failover.COUNTS_KEY, "chat-a:failed", 1)
    client.hincrby(failover.COUNTS_KEY, "b:resumed", 2)
    samples = {
        (s.name, s.labels["deployment"]): s.value
        for fam in text_string_to_metric_families(render(client))
        for s in fam.samples
        if s.name.startswith("switchyard_requests_")
    }
    assert samples == {
        ("switchyard_requests_resumed_total", "b"): 2,
        ("switchyard_requests_failover_failed_total", "b"): 0,
        ("switchyard_requests_resumed_total", "chat-a"): 3,
        ("switchyard_requests_failover_failed_total", "chat-a"): 1,
    }
    client.delete(failover.COUNTS_KEY)
