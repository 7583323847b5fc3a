"""OpenAI's Files and Batch API (controlplane/batches): the endpoints' shapes (parsed by the
`openai` package's own types), validation with line numbers, owner scoping, and every status a
batch goes through, with the dispatcher's line states and their exactly-once results. The
dispatcher sending lines to a live stack is tests/integration/test_batch_serving.py."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone
from openai.types import Batch as OpenAIBatch
from openai.types import FileDeleted, FileObject

from controlplane.autoscaling.models import Autoscaling
from controlplane.batches import dispatcher, services, slo_gate
from controlplane.batches.models import Batch, BatchLine
from controlplane.batches.slo_gate import FillGate
from controlplane.batches.tokens import token_for
from controlplane.deployments.models import Deployment, Replica
from controlplane.gateway import inspector
from controlplane.gateway.services import create_api_key
from tests.controlplane.test_session_turns import serve
from tests.support.played_replica import played_replica
from workers.protocol.replica import BATCH_PRIORITY

pytestmark = pytest.mark.django_db


def line(i: int, model: str = "turns", url: str = "/v1/chat/completions", **body) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 4, **body}
    return {"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body}


def jsonl(items: list) -> bytes:
    return "".join(json.dumps(item) + "\n" for item in items).encode()


@pytest.fixture
def key(django_user_model, tmp_path, settings):
    settings.BATCH_FILES_DIR = tmp_path / "files"
    serve()  # the deployment "turns", with a ready replica
    return create_api_key(name="batch", owner=django_user_model.objects.create_user("batcher"))[1]


def auth(secret: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


def upload(client, key: str, data: bytes, purpose: str = "batch"):
    return client.post("/v1/files", {"purpose": purpose, "file": SimpleUploadedFile("in.jsonl", data)}, **auth(key))


def create(client, key: str, items: list, endpoint: str = "/v1/chat/completions", **extra):
    f = upload(client, key, jsonl(items))
    assert f.status_code == 200, f.content
    body = {"input_file_id": f.json()["id"], "endpoint": endpoint, "completion_window": "24h", **extra}
    return client.post("/v1/batches", body, content_type="application/json", **auth(key))


def test_a_file_is_uploaded_listed_read_and_deleted(client, key):
    data = jsonl([line(i) for i in range(3)])
    created = upload(client, key, data)
    assert created.status_code == 200, created.content
    f = FileObject.model_validate(created.json())
    assert (f.purpose, f.bytes, f.filename, f.status) == ("batch", len(data), "in.jsonl", "processed")
    listed = client.get("/v1/files", **auth(key)).json()
    assert [item["id"] for item in listed["data"]] == [f.id]
    assert FileObject.model_validate(client.get(f"/v1/files/{f.id}", **auth(key)).json()) == f
    content = client.get(f"/v1/files/{f.id}/content", **auth(key))
    assert content.status_code == 200 and content.content == data
    deleted = FileDeleted.model_validate(client.delete(f"/v1/files/{f.id}", **auth(key)).json())
    assert deleted.deleted and deleted.id == f.id
    assert client.get(f"/v1/files/{f.id}", **auth(key)).status_code == 404
    assert not (settings.BATCH_FILES_DIR / f.id).exists()


@pytest.mark.parametrize(
    ("data", "purpose", "says"),
    [
        (b'{"custom_id": "a"}\nnot json\n', "batch", "Line 2"),
        (b"[1, 2]\n", "batch", "Line 1"),
        (b"", "batch", "no lines"),
        (b"\xff\xfe", "batch", "UTF-8"),
        (b'{"custom_id": "a"}\n', "fine-tune", "'purpose' must be 'batch'"),
    ],
)
def test_a_bad_upload_is_a_400_saying_why(client, key, data, purpose, says):
    response = upload(client, key, data, purpose)
    assert response.status_code == 400, response.content
    assert says in response.json()["error"]["message"]


def test_a_file_over_the_line_limit_is_refused(client, key, settings):
    settings.BATCH_MAX_LINES = 3
    response = upload(client, key, jsonl([line(i) for i in range(4)]))
    assert response.status_code == 400 and "at most 3" in response.json()["error"]["message"]


def test_a_valid_batch_is_in_progress_with_its_counts(client, key):
    response = create(client, key, [line(i) for i in range(5)], metadata={"job": "nightly"})
    assert response.status_code == 200, response.content
    batch = OpenAIBatch.model_validate(response.json())
    assert batch.status == "in_progress" and batch.in_progress_at is not None
    assert batch.request_counts.total == 5 and batch.request_counts.completed == 0
    assert batch.metadata == {"job": "nightly"} and batch.model == "turns"
    assert batch.expires_at - batch.created_at == 24 * 3600
    assert [ln.custom_id for ln in BatchLine.objects.filter(batch_id=batch.id)] == [f"req-{i}" for i in range(5)]
    listed = client.get("/v1/batches", **auth(key)).json()
    assert [b["id"] for b in listed["data"]] == [batch.id] and listed["has_more"] is False


def test_bad_lines_fail_the_batch_at_validation_with_their_line_numbers(client, key):
    items = [
        line(0),
        line(1, temperature=7),  # line 2: a value the chat endpoint refuses
        {**line(0)},  # line 3: custom_id used on line 1
        line(3, url="/v1/completions"),  # line 4: not the batch's endpoint
        {**line(4), "method": "GET"},  # line 5
        line(5, stream=True),  # line 6
    ]
    batch = OpenAIBatch.model_validate(create(client, key, items).json())
    assert batch.status == "failed" and batch.failed_at is not None
    errors = [(e.line, e.param, e.code) for e in batch.errors.data]
    assert errors == [
        (2, "body.temperature", "invalid_request"),
        (3, "custom_id", "duplicate_custom_id"),
        (4, "url", "mismatched_endpoint"),
        (5, "method", "invalid_request"),
        (6, "body.stream", "invalid_request"),
    ]
    assert "temperature" in batch.errors.data[0].message
    assert not BatchLine.objects.filter(batch_id=batch.id).exists()


def test_a_batch_names_one_model_the_key_may_use(client, key):
    mixed = OpenAIBatch.model_validate(create(client, key, [line(0), line(1, model="other")]).json())
    assert next((e.line, e.code) for e in mixed.errors.data) == (2, "mismatched_model")
    unknown = OpenAIBatch.model_validate(create(client, key, [line(0, model="nowhere")]).json())
    assert [(e.line, e.code) for e in unknown.errors.data] == [(1, "model_not_found")]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"endpoint": "/v1/embeddings"}, "endpoint"),
        ({"completion_window": "1h"}, "completion_window"),
        ({"input_file_id": "file-nope"}, "input_file_id"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_a_bad_batch_request_is_a_400_naming_the_parameter(client, key, body, param):
    f = upload(client, key, jsonl([line(0)])).json()
    request = {"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h", **body}
    response = client.post("/v1/batches", request, content_type="application/json", **auth(key))
    assert response.status_code == 400 and response.json()["error"]["param"] == param, response.content


def test_another_owners_files_and_batches_are_not_found(client, key, django_user_model):
    batch = create(client, key, [line(0)]).json()
    _, other = create_api_key(name="other", owner=django_user_model.objects.create_user("someone-else"))
    assert client.get(f"/v1/batches/{batch['id']}", **auth(other)).status_code == 404
    assert client.post(f"/v1/batches/{batch['id']}/cancel", **auth(other)).status_code == 404
    assert client.get(f"/v1/files/{batch['input_file_id']}/content", **auth(other)).status_code == 404
    assert client.get("/v1/batches", **auth(other)).json()["data"] == []


def test_the_batch_token_serves_as_the_batchs_key_at_the_lowest_priority(client, key):
    batch = create(client, key, [line(0)]).json()
    [replica] = Replica.objects.filter(deployment__slug="turns")
    rc = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    with played_replica(rc, replica.pk) as seen:
        answer = client.post(
            "/v1/chat/completions", line(0)["body"], content_type="application/json", **auth(token_for(batch["id"]))
        )
    assert answer.status_code == 200, answer.content
    assert seen[0]["share"] == {"priority": BATCH_PRIORITY, "tenant": "batcher", "weight": 1.0}
    forged = token_for(batch["id"])[:-4] + "0000"
    assert (
        client.post(
            "/v1/chat/completions", line(0)["body"], content_type="application/json", **auth(forged)
        ).status_code
        == 401
    )
    assert client.get("/v1/batches", **auth(token_for(batch["id"]))).status_code == 403


# -- the dispatcher's pace under a TTFT SLO (slo_gate.py) --------------------------------------------
def test_the_fill_halves_when_interactive_ttft_breaks_the_slo_and_grows_back_by_tenths():
    gate = FillGate(ceiling=0.8, floor=0.1, checked_at=0.0, seen_until=0.0)
    assert gate.fill == 0.8 and gate.due(slo_gate.ADJUST_SECONDS)

    def ended(at: float, *ms: float) -> list[tuple[float, float]]:
        return [(at, value) for value in ms]

    assert gate.adjust(10.0, ended(9, *[90.0] * 9, 400.0), slo_ms=300) == 0.8  # p90 of ten is the 9th: 90 ms
    assert gate.seen_until == 9 and not gate.due(10.0 + slo_gate.ADJUST_SECONDS / 2)
    assert gate.adjust(12.0, ended(11, 350.0, 320.0, 100.0), slo_ms=300) == 0.4
    assert gate.adjust(14.0, ended(13, 500.0), slo_ms=300) == 0.2
    assert gate.adjust(16.0, ended(15, 500.0), slo_ms=300) == 0.1  # never below the floor (one line)
    assert gate.adjust(18.0, ended(17, 500.0), slo_ms=300) == 0.1
    assert gate.adjust(20.0, [], slo_ms=300) == pytest.approx(0.18)  # no interactive request: grow
    assert gate.seen_until == 17
    assert gate.adjust(22.0, ended(21, 250.0, 200.0), slo_ms=300) == pytest.approx(0.26)
    for t in range(24, 40, 2):
        gate.adjust(float(t), ended(t - 1, 100.0), slo_ms=300)
    assert gate.fill == 0.8 and gate.breaches == 4  # never above BATCH_FILL


def test_the_gateway_keeps_interactive_ttfts_and_not_a_batchs(client, key):
    batch = create(client, key, [line(0)]).json()
    [replica] = Replica.objects.filter(deployment__slug="turns")
    rc = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    before = time.time()
    with played_replica(rc, replica.pk):
        for secret in (key, token_for(batch["id"]), key):
            answer = client.post(
                "/v1/chat/completions", line(0)["body"], content_type="application/json", **auth(secret)
            )
            assert answer.status_code == 200, answer.content
    ended = inspector.interactive_ttfts(rc, "turns", before)
    assert len(ended) == 2 and all(before < at <= time.time() and 0 < ms < 60_000 for at, ms in ended)
    assert inspector.interactive_ttfts(rc, "turns", time.time()) == []


def test_the_dispatcher_takes_batch_fill_of_the_slots_and_less_while_the_slo_breaks(key, settings, monkeypatch):
    """Requests that ended before the dispatcher started pacing do not count; those after do."""
    settings.BATCH_FILL = 1.0
    deployment = Deployment.objects.get(slug="turns")
    rc = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)

    def ended(*ms: float) -> None:
        rc.lpush(inspector.ttft_key("turns"), *[f"{time.time():.6f}:{value}" for value in ms])

    d = dispatcher.Dispatcher()
    try:
        assert d.capacity("turns", 0) == deployment.max_num_seqs  # no SLO: BATCH_FILL of the slots
        Autoscaling.objects.create(deployment=deployment, ttft_p90_ms=200.0)
        ended(900.0, 900.0)  # before the gate: another dispatcher's past
        monkeypatch.setattr(slo_gate, "ADJUST_SECONDS", 0.0)  # every look is due
        assert d.capacity("turns", 0) == deployment.max_num_seqs  # the gate starts at BATCH_FILL
        assert d.capacity("turns", 0) == deployment.max_num_seqs  # nothing new ended
        ended(150.0, 900.0, 800.0)
        assert d.capacity("turns", 0) == deployment.max_num_seqs // 2  # broken: half
        assert d.capacity("turns", 0) == int(deployment.max_num_seqs * 0.6)  # none broke it since
    finally:
        d.close()
        rc.delete(inspector.ttft_key("turns"))


# -- the dispatcher's states ------------------------------------------------------------------------
def _ids(file_bytes: bytes) -> list[str]:
    return [json.loads(row)["custom_id"] for row in file_bytes.decode().splitlines()]


def test_each_line_is_answered_once_across_a_dispatcher_takeover(client, key):
    batch = Batch.objects.get(pk=create(client, key, [line(i) for i in range(4)]).json()["id"])
    assert dispatcher.claim_batches("A") == [batch.id]
    assert dispatcher.claim_batches("B") == []  # A holds the lease
    sent = dispatcher.claim_lines(batch.id, "A", 3)
    assert [ln.index for ln in sent] == [0, 1, 2] and all(ln.attempts == 1 for ln in sent)
    ok = services.line_result(sent[0], 200, {"id": "x"}, "r0")
    assert services.write_result(sent[0], "A", 1, True, ok)
    assert not services.write_result(sent[0], "A", 1, True, ok)  # written once
    # A dies: its lease runs out and B takes the batch; the lines A had in flight go out again.
    Batch.objects.filter(pk=batch.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    assert dispatcher.claim_batches("B") == [batch.id]
    assert set(BatchLine.objects.filter(batch=batch, state="pending").values_list("index", flat=True)) == {1, 2, 3}
    assert dispatcher.renew_lease(batch.id, "A") is None  # A, if alive after all, lets go
    assert not services.write_result(sent[1], "A", 1, True, ok)  # and its late answer is dropped
    resent = dispatcher.claim_lines(batch.id, "B", 10)
    assert [(ln.index, ln.attempts) for ln in resent] == [(1, 2), (2, 2), (3, 1)]
    for ln in resent:
        status = 200 if ln.index != 2 else 400
        result = services.line_result(ln, status, {"i": ln.index}, f"r{ln.index}")
        assert services.write_result(ln, "B", ln.attempts, status == 200, result)
    assert not dispatcher.has_open_lines(batch.id)
    services.finalize(batch, Batch.Status.COMPLETED)
    done = OpenAIBatch.model_validate(client.get(f"/v1/batches/{batch.id}", **auth(key)).json())
    assert done.status == "completed" and done.finalizing_at and done.completed_at
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 1)
    output = client.get(f"/v1/files/{done.output_file_id}/content", **auth(key)).content
    errors = client.get(f"/v1/files/{done.error_file_id}/content", **auth(key)).content
    assert _ids(output) == ["req-0", "req-1", "req-3"] and _ids(errors) == ["req-2"]
    first = json.loads(output.decode().splitlines()[0])
    assert first["response"] == {"status_code": 200, "request_id": "r0", "body": {"id": "x"}} and first["error"] is None
    meta = FileObject.model_validate(client.get(f"/v1/files/{done.output_file_id}", **auth(key)).json())
    assert meta.purpose == "batch_output" and meta.bytes == len(output)


def _run_dispatcher_once(batch_id: str) -> None:
    """The dispatcher's own loop for one batch (it ends the batch before sending anything)."""
    d = dispatcher.Dispatcher()
    assert dispatcher.claim_batches(d.token) == [batch_id]

    async def run():
        d.client = None  # nothing is sent: the batch ends at its first tick
        await asyncio.wait_for(d._batch(batch_id), 20)

    try:
        asyncio.run(run())
    finally:
        d.close()


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_batch_ends_with_every_unanswered_line_in_its_error_file(client, key):
    batch_id = create(client, key, [line(i) for i in range(3)]).json()["id"]
    cancelling = OpenAIBatch.model_validate(client.post(f"/v1/batches/{batch_id}/cancel", **auth(key)).json())
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    _run_dispatcher_once(batch_id)
    done = OpenAIBatch.model_validate(client.get(f"/v1/batches/{batch_id}", **auth(key)).json())
    assert done.status == "cancelled" and done.cancelled_at is not None and done.output_file_id is None
    errors = client.get(f"/v1/files/{done.error_file_id}/content", **auth(key)).content.decode().splitlines()
    assert [json.loads(row)["error"]["code"] for row in errors] == ["batch_cancelled"] * 3
    assert _ids(b"\n".join(e.encode() for e in errors)) == ["req-0", "req-1", "req-2"]
    again = client.post(f"/v1/batches/{batch_id}/cancel", **auth(key))
    assert again.status_code == 200 and again.json()["status"] == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_a_batch_past_its_window_expires_with_batch_expired_errors(client, key):
    batch_id = create(client, key, [line(i) for i in range(2)]).json()["id"]
    Batch.objects.filter(pk=batch_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    _run_dispatcher_once(batch_id)
    done = OpenAIBatch.model_validate(client.get(f"/v1/batches/{batch_id}", **auth(key)).json())
    assert done.status == "expired" and done.expired_at is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (0, 2)
    errors = client.get(f"/v1/files/{done.error_file_id}/content", **auth(key)).content.decode().splitlines()
    assert {json.loads(row)["error"]["code"] for row in errors} == {"batch_expired"}
    refused = client.post(f"/v1/batches/{batch_id}/cancel", **auth(key))
    assert refused.status_code == 409 and "expired" in refused.json()["error"]["message"]


# -- edges -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("limit", ["²", "0", "-1", "9" * 5000, "abc", "101"])
def test_a_bad_limit_is_a_400(client, key, limit):
    response = client.get("/v1/batches", {"limit": limit}, **auth(key))
    assert response.status_code == 400 and response.json()["error"]["param"] == "limit"


def test_ids_with_a_nul_are_simply_not_found(client, key):
    assert client.get("/v1/batches/batch_\x00x", **auth(key)).status_code == 404
    assert client.get("/v1/files/file-\x00x", **auth(key)).status_code == 404
    assert client.get("/v1/batches", {"after": "batch_\x00"}, **auth(key)).status_code == 400


def test_a_line_separator_inside_a_json_string_is_not_a_line_break(client, key):
    odd = line(0, messages=[{"role": "user", "content": "one\u2028two\u0085three"}])
    text = json.dumps(odd, ensure_ascii=False) + "\n" + json.dumps(line(1)) + "\n"
    f = upload(client, key, text.encode())
    assert f.status_code == 200, f.content
    body = {"input_file_id": f.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    batch = client.post("/v1/batches", body, content_type="application/json", **auth(key)).json()
    assert batch["status"] == "in_progress" and batch["request_counts"]["total"] == 2, batch


def test_a_batch_cancelled_while_it_is_validated_stays_cancelled(client, key):
    from controlplane.batches.validation import validate
    from controlplane.gateway.generation import caller_for_secret

    f = upload(client, key, jsonl([line(0), line(1)])).json()

    def cancelled_meanwhile(lines, endpoint, caller):
        services.cancel_batch(Batch.objects.get(status=Batch.Status.VALIDATING))  # the client cancels now
        return validate(lines, endpoint, caller)

    body = {"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    batch = services.create_batch(caller_for_secret(key), body, cancelled_meanwhile)
    assert batch.status == Batch.Status.CANCELLING and batch.total == 2


def test_a_file_whose_bytes_are_gone_is_a_clear_409(client, key):
    f = upload(client, key, jsonl([line(0)])).json()
    (settings.BATCH_FILES_DIR / f["id"]).unlink()  # another web process's directory, say
    body = {"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    response = client.post("/v1/batches", body, content_type="application/json", **auth(key))
    assert response.status_code == 409 and "BATCH_FILES_DIR" in response.json()["error"]["message"]
    assert not Batch.objects.exists()


def test_a_dispatcher_run_that_ended_gives_back_its_lines_and_a_lost_lease_claims_nothing(client, key):
    batch = Batch.objects.get(pk=create(client, key, [line(i) for i in range(3)]).json()["id"])
    assert dispatcher.claim_batches("A") == [batch.id]
    dispatcher.claim_lines(batch.id, "A", 2)
    dispatcher.release_lines(batch.id, "A")  # its run failed (the database away): nothing is lost
    assert set(BatchLine.objects.filter(batch=batch).values_list("state", flat=True)) == {"pending"}
    Batch.objects.filter(pk=batch.pk).update(lease_owner="B")
    assert dispatcher.claim_lines(batch.id, "A", 3) == []
