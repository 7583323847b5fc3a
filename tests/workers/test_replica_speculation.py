"""A replica process started from a spec with speculation (as a node agent starts one) runs its
engine with that speculative_config and reports what it drafted and accepted in its status
hash; one without speculation reports nothing of it; one with method auto also how many guesses
it chose per sequence. All give the same greedy tokens."""

from __future__ import annotations

import pytest
import redis
from django.conf import settings

from tests.support.stack import replica_request, wait_for
from workers.bench.processes import start_replica, stop
from workers.demo import MODEL_DIR
from workers.protocol import replica as protocol
from workers.protocol.replica import ReplicaSpec, ReplicaStatus, SpeculativeSpec

pytestmark = pytest.mark.timeout(180)
NGRAM, PLAIN, AUTO = 9521, 9522, 9523
# The demo model goes on with what the prompt says twice over: text the n-gram drafter finds.
PROMPT = "The capital of Japan is Tokyo. The capital of France is Paris. The capital of Japan is"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    state = tmp_path_factory.mktemp("spec-replicas")
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    started = []
    for rid, speculative in ((NGRAM, SpeculativeSpec("ngram", 3)), (PLAIN, None), (AUTO, SpeculativeSpec("auto", 3))):
        client.delete(protocol.status_key(rid), protocol.requests_key(rid))
        spec = ReplicaSpec(replica_id=rid, deployment="spec", model_dir=str(MODEL_DIR), model_name="demo",
                           dtype="float32", threads=1, redis_url=settings.REDIS_URL, kv_cache_bytes=16 << 20,
                           speculative=speculative)  # fmt: skip
        started.append(start_replica(spec, state))
    try:
        for rid in (NGRAM, PLAIN, AUTO):
            wait_for(lambda rid=rid: client.hget(protocol.status_key(rid), "state") == "ready", 90, f"replica {rid}")
        yield client
    finally:
        stop([p for p, _ in started], [log for _, log in started], timeout=10)
        client.close()


def generate(client: redis.Redis, replica_id: int, prompt: str, max_tokens: int = 16) -> list[int]:
    events = replica_request(client, replica_id, {"temperature": 0.0, "max_tokens": max_tokens}, prompt=prompt)
    return [t for event in events for t in event.get("token_ids", [])]


def metrics(client: redis.Redis, replica_id: int) -> dict:
    return ReplicaStatus.from_hash(client.hgetall(protocol.status_key(replica_id))).metrics


def test_a_speculating_replica_reports_its_drafts_and_answers_as_one_that_does_not(replicas):
    assert generate(replicas, NGRAM, PROMPT) == generate(replicas, PLAIN, PROMPT)

    def drafted():
        spec = metrics(replicas, NGRAM).get("speculative")
        return spec if spec and spec["num_drafts"] > 0 else None

    spec = wait_for(drafted, 5, "the replica to report its drafts")
    assert spec["method"] == "ngram"
    assert len(spec["drafted_per_position"]) == len(spec["accepted_per_position"]) == 3
    assert spec["drafted_per_position"][0] == spec["num_drafts"]  # every run guesses at least one token
    assert all(a <= d for a, d in zip(spec["accepted_per_position"], spec["drafted_per_position"], strict=True))
    assert spec["verify_seconds"] >= 0.0 and spec["draft_seconds"] >= 0.0
    assert "speculative" not in metrics(replicas, PLAIN)


def test_an_auto_replica_reports_the_k_it_chose_and_answers_as_one_that_does_not(replicas):
    assert generate(replicas, AUTO, PROMPT) == generate(replicas, PLAIN, PROMPT)

    def chose():
        spec = metrics(replicas, AUTO).get("speculative")
        return spec if spec and sum(spec.get("chosen_k", [])) > 0 else None

    spec = wait_for(chose, 5, "the replica to report the k it chose")
    assert spec["method"] == "auto" and len(spec["chosen_k"]) == 4  # k = 0..3
    assert sum(spec["chosen_k"][1:]) >= 1  # the first verify is always tried (its cost unknown till then)
    assert set(spec["gain_seconds"]) == {"expected_plain", "expected", "measured_plain", "measured"}
    assert "chosen_k" not in metrics(replicas, NGRAM)["speculative"]  # a fixed k chooses nothing
