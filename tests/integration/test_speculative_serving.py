"""Speculative decoding through the whole stack: uvicorn (gateway), the control worker, a node
agent and the replica processes it starts for three deployments of the demo model, without
speculation, with n-gram and with EAGLE-3 (a random head: its guesses are mostly wrong, which the
target's verification must catch). Greedy answers stream the same text from all three; /metrics
and the telemetry points show what the speculating replicas drafted."""

from __future__ import annotations

import pytest

from tests.engine.checkpoints import build_eagle3_head
from tests.support.platform import platform
from tests.support.stack import metric, sample_sum, scrape, wait_for
from workers.demo import MODEL_DIR

pytestmark = [pytest.mark.timeout(300), pytest.mark.django_db]
METHODS = ("none", "ngram", "eagle3")
# Answers that repeat words of their questions (the n-gram drafter guesses from them), and a
# tool call that copies its argument from the question.
PROMPTS = [
    ("What is the capital of Japan?", False),
    ("What is the capital of France?", False),
    ("What is the weather in Paris?", True),
]


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory):
    head = build_eagle3_head(tmp_path_factory.mktemp("draft") / "head", MODEL_DIR, draft_vocab_size=512)
    # Every prompt of the disaggregated deployment goes through its prefill replica.
    env = {"REPLICA_MAX_RESTARTS": "2", "PD_LOCAL_PREFILL_TOKENS": "0", "CPU_REPLICAS_PER_DEVICE": "5"}
    eagle3 = {"speculative_method": "eagle3", "speculative_k": 3, "draft_model": "random-head"}
    settings = {"none": {}, "ngram": {"speculative_method": "ngram", "speculative_k": 3}, "eagle3": eagle3}
    deployments = [{"slug": method, "replicas": 1, **settings[method]} for method in METHODS]
    deployments.append({"slug": "pd-eagle3", "mode": "disaggregated", "replicas": 0, "prefill_replicas": 1,
                        "decode_replicas": 1, **eagle3})  # fmt: skip
    with platform(django_db_blocker, tmp_path_factory, "spec", deployments=deployments, env=env,
                  models={"random-head": head}, staff=True) as p:  # fmt: skip
        yield p


@pytest.fixture
def client(stack):
    return stack.client()


def streamed(client, deployment: str, question: str, tools: bool) -> str:
    """The greedy answer's text as streamed, tool calls' names and arguments included."""
    from workers.demo.corpus import tool_schemas

    extra = {"tools": tool_schemas()} if tools else {}
    stream = client.chat.completions.create(model=deployment, messages=[{"role": "user", "content": question}],
                                            temperature=0, max_tokens=32, stream=True, **extra)  # fmt: skip
    parts = []
    for chunk in stream:
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            for call in choice.delta.tool_calls or []:
                parts += [call.function.name or "", call.function.arguments or ""]
    return "".join(parts)


@pytest.mark.parametrize(("question", "tools"), PROMPTS)
def test_speculating_deployments_stream_the_same_greedy_text(client, question, tools):
    plain = streamed(client, "none", question, tools)
    assert ("get_weather" in plain) if tools else plain
    assert streamed(client, "ngram", question, tools) == plain
    assert streamed(client, "eagle3", question, tools) == plain


def test_the_speculating_replicas_report_their_drafts_to_metrics_and_telemetry(client, stack):
    from controlplane.common import redis as redis_client
    from controlplane.telemetry.history import sample

    replica = {method: str(stack.replica(method).pk) for method in METHODS}
    for method in METHODS:
        streamed(client, method, *PROMPTS[0])

    def drafts(method: str) -> float:
        return metric(stack.base, "switchyard_spec_drafts_total", replica=replica[method])

    for method in ("ngram", "eagle3"):
        wait_for(lambda method=method: drafts(method) > 0, 5, f"the {method} replica's drafts in /metrics")
        # One scrape: a later one may already count drafts a newer heartbeat reported.
        samples, labels = scrape(stack.base), {"replica": replica[method]}
        accepted = sample_sum(samples, "switchyard_spec_accepted_tokens_total", **labels, position="0")
        drafted = sample_sum(samples, "switchyard_spec_draft_tokens_total", **labels, position="0")
        assert 0 <= accepted <= drafted == sample_sum(samples, "switchyard_spec_drafts_total", **labels)
        assert sample_sum(samples, "switchyard_spec_mean_acceptance_length", **labels) >= 1
    assert drafts("none") == 0  # no series at all for a replica that does not speculate

    points = sample(redis_client.client())
    assert points["none"]["speculation"] is None
    for method in ("ngram", "eagle3"):
        spec = points[method]["speculation"]
        assert spec["num_drafts"] > 0 and len(spec["acceptance_per_position"]) == 3
        assert spec["mean_acceptance_length"] >= 1


def test_a_disaggregated_deployment_speculates_on_its_decode_replica_only(client, stack):
    """The decode replica drafts with the EAGLE-3 head from KV another replica computed."""
    question, tools = PROMPTS[0]
    raw = client.chat.completions.with_raw_response.create(
        model="pd-eagle3", messages=[{"role": "user", "content": question}], temperature=0, max_tokens=32
    )
    decode, prefill = stack.replica("pd-eagle3", "decode"), stack.replica("pd-eagle3", "prefill")
    assert raw.headers["x-switchyard-prefill-replica"] == str(prefill.pk)
    assert raw.parse().choices[0].message.content == streamed(client, "none", question, tools)

    def drafts(replica) -> float:
        return metric(stack.base, "switchyard_spec_drafts_total", replica=str(replica.pk))

    wait_for(lambda: drafts(decode) > 0, 5, "the decode replica's drafts in /metrics")
    assert drafts(prefill) == 0
