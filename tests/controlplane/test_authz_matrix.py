"""Who may do what: every endpoint against every kind of caller, written out as one table.

Callers (the columns):
  anonymous        no credentials
  user             a non-staff user's management token (`Authorization: Bearer syt-...`)
  staff            a staff user's management token
  key              an API key (`Bearer sy-...`), usable on every deployment
  revoked          a revoked API key
  other_key        an API key restricted to another deployment (allowed_deployments)
  session          the staff user signed in to the console (session cookie), sending the CSRF
                   token; on a websocket: from an allowed origin
  session_no_csrf  the same session without the CSRF token; on a websocket: from a foreign origin
  metrics_token    `Bearer <METRICS_TOKEN>`, the Prometheus scraper's credential

The management API (/api/v1) takes management tokens and the session: any signed-in user reads,
only staff change anything (403), a session's unsafe requests need the CSRF token (403), an API
key is no management credential (401). The OpenAI API (/v1) takes API keys only; a key restricted
to other deployments gets 403, and a valid key on a deployment with no ready replica gets 503:
auth passed. Every route in the URL conf (and every operation in the OpenAPI schema) must have a
row, or be listed in NOT_IN_MATRIX with the reason, so a new endpoint fails here until its row is
written.
"""

import json
from dataclasses import dataclass
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import transaction
from django.test import Client, override_settings
from django.urls import URLResolver, get_resolver, resolve
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator

from controlplane.batches.models import Batch, BatchFile
from controlplane.catalog.models import Model
from controlplane.common.services import create_token
from controlplane.config.asgi import application
from controlplane.config.routing import websocket_urlpatterns
from controlplane.config.urls import CONSOLE_PAGES
from controlplane.deployments.models import CachePolicy, Deployment, Replica
from controlplane.events.models import Event
from controlplane.events.services import record_event
from controlplane.gateway.models import StoredResponse
from controlplane.gateway.services import create_api_key, revoke_api_key
from controlplane.inventory.services import register_node
from controlplane.telemetry.history import GROUP as METRICS_GROUP

CALLERS = ("anonymous", "user", "staff", "key", "revoked", "other_key", "session", "session_no_csrf", "metrics_token")
METRICS_TOKEN = "scrape-secret"
CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@dataclass(frozen=True)
class Row:
    method: str
    path: str  # {id} / {slug}: the seeded object of that kind (see `seeded`)
    expected: tuple[int, ...]  # one status per caller, in CALLERS' order
    body: dict | None = None  # sent as JSON
    metrics_token_set: bool = True

    @property
    def label(self) -> str:
        return f"{self.method} {self.path}" + ("" if self.metrics_token_set else " (METRICS_TOKEN unset)")


# fmt: off
ROWS = [
    #                                                    anon user staff key rvkd other sess nocsrf metrics
    Row("GET",    "/api/v1/models/",                    (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("POST",   "/api/v1/models/",                    (401, 403, 201, 401, 401, 401, 201, 403, 401),
        {"name": "fresh", "source": "org/fresh", "source_type": "hub"}),
    Row("GET",    "/api/v1/models/{id}/",               (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("DELETE", "/api/v1/models/{id}/",               (401, 403, 204, 401, 401, 401, 204, 403, 401)),
    Row("GET",    "/api/v1/deployments/",               (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("POST",   "/api/v1/deployments/",               (401, 403, 201, 401, 401, 401, 201, 403, 401),
        {"slug": "fresh", "model": "tiny"}),
    Row("GET",    "/api/v1/deployments/{slug}/",        (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("PUT",    "/api/v1/deployments/{slug}/",        (401, 403, 200, 401, 401, 401, 200, 403, 401),
        {"slug": "demo", "model": "tiny", "replicas": 2}),
    Row("PATCH",  "/api/v1/deployments/{slug}/",        (401, 403, 200, 401, 401, 401, 200, 403, 401),
        {"replicas": 2}),
    Row("DELETE", "/api/v1/deployments/{slug}/",        (401, 403, 204, 401, 401, 401, 204, 403, 401)),
    Row("POST",   "/api/v1/deployments/{slug}/start/",  (401, 403, 200, 401, 401, 401, 200, 403, 401)),
    Row("POST",   "/api/v1/deployments/{slug}/stop/",   (401, 403, 200, 401, 401, 401, 200, 403, 401)),
    Row("POST",   "/api/v1/deployments/{slug}/restart/", (401, 403, 200, 401, 401, 401, 200, 403, 401)),
    Row("POST",   "/api/v1/deployments/{slug}/scale/",  (401, 403, 200, 401, 401, 401, 200, 403, 401),
        {"replicas": 3}),
    Row("POST",   "/api/v1/deployments/{slug}/drain/",  (401, 403, 200, 401, 401, 401, 200, 403, 401), {}),
    Row("GET",    "/api/v1/deployments/{slug}/autoscaling/", (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("PATCH",  "/api/v1/deployments/{slug}/autoscaling/", (401, 403, 200, 401, 401, 401, 200, 403, 401),
        {"max_replicas": 3}),
    Row("GET",    "/api/v1/cache-policies/",            (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("POST",   "/api/v1/cache-policies/",            (401, 403, 201, 401, 401, 401, 201, 403, 401),
        {"name": "fresh"}),
    Row("GET",    "/api/v1/cache-policies/{id}/",       (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("PUT",    "/api/v1/cache-policies/{id}/",       (401, 403, 200, 401, 401, 401, 200, 403, 401),
        {"name": "default", "block_size": 32}),
    Row("PATCH",  "/api/v1/cache-policies/{id}/",       (401, 403, 200, 401, 401, 401, 200, 403, 401),
        {"block_size": 32}),
    Row("DELETE", "/api/v1/cache-policies/{id}/",       (401, 403, 204, 401, 401, 401, 204, 403, 401)),
    Row("GET",    "/api/v1/replicas/",                  (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("GET",    "/api/v1/replicas/{id}/",             (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("GET",    "/api/v1/nodes/",                     (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("GET",    "/api/v1/nodes/{id}/",                (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("GET",    "/api/v1/devices/",                   (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("GET",    "/api/v1/devices/{id}/",              (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("GET",    "/api/v1/events/",                    (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("GET",    "/api/v1/events/{id}/",               (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("GET",    "/api/v1/telemetry/history/?deployment=demo",
                                                        (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    # The capacity planner computes and changes nothing: any signed-in caller (a session with CSRF).
    Row("POST",   "/api/v1/plan/",                      (401, 200, 200, 401, 401, 401, 200, 403, 401),
        {"config": {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}}),
    # API keys: a user sees only their own (the seeded one is staff's: 404), writes are staff's.
    Row("GET",    "/api/v1/api-keys/",                  (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("POST",   "/api/v1/api-keys/",                  (401, 403, 201, 401, 401, 401, 201, 403, 401),
        {"name": "fresh", "allowed_deployments": ["demo"]}),
    Row("GET",    "/api/v1/api-keys/{id}/",             (401, 404, 200, 401, 401, 401, 200, 200, 401)),
    Row("PUT",    "/api/v1/api-keys/{id}/",             (401, 403, 200, 401, 401, 401, 200, 403, 401),
        {"name": "renamed"}),
    Row("PATCH",  "/api/v1/api-keys/{id}/",             (401, 403, 200, 401, 401, 401, 200, 403, 401),
        {"name": "renamed"}),
    Row("DELETE", "/api/v1/api-keys/{id}/",             (401, 403, 204, 401, 401, 401, 204, 403, 401)),
    Row("POST",   "/api/v1/api-keys/{id}/revoke/",      (401, 403, 200, 401, 401, 401, 200, 403, 401)),
    # The console's sign-in: CSRF-checked even without a session (login CSRF); a token is no
    # session, so it cannot sign in either (no CSRF cookie).
    Row("POST",   "/api/v1/auth/login/",                (403, 403, 403, 401, 401, 401, 200, 403, 401),
        {"username": "ops", "password": "pw-ops"}),
    Row("POST",   "/api/v1/auth/logout/",               (204, 204, 204, 401, 401, 401, 204, 403, 401)),
    Row("GET",    "/api/v1/auth/me/",                   (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    # The schema and its docs are public; a credential that is no management token is refused.
    Row("GET",    "/api/schema/",                       (200, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("GET",    "/api/docs/",                         (200, 200, 200, 401, 401, 401, 200, 200, 401)),
    # The OpenAI API: API keys only; 503 = admitted, and no replica is ready.
    Row("GET",    "/v1/models",                         (401, 401, 401, 200, 401, 200, 401, 401, 401)),
    Row("GET",    "/v1/models/demo",                    (401, 401, 401, 200, 401, 403, 401, 401, 401)),
    Row("POST",   "/v1/chat/completions",               (401, 401, 401, 503, 401, 403, 401, 401, 401), CHAT),
    Row("POST",   "/v1/completions",                    (401, 401, 401, 503, 401, 403, 401, 401, 401),
        {"model": "demo", "prompt": "hi", "max_tokens": 4}),
    # The Responses API: a stored response is its key owner's, whichever of their keys asks (the
    # seeded one is the user's, whose keys are `key` and `other_key`).
    Row("POST",   "/v1/responses",                      (401, 401, 401, 503, 401, 403, 401, 401, 401),
        {"model": "demo", "input": "hi", "max_output_tokens": 4}),
    Row("GET",    "/v1/responses/{id}",                 (401, 401, 401, 200, 401, 200, 401, 401, 401)),
    Row("DELETE", "/v1/responses/{id}",                 (401, 401, 401, 200, 401, 200, 401, 401, 401)),
    # Anthropic's Messages API: API keys (here as Bearer; x-api-key in tests/controlplane/test_agent_apis.py).
    Row("POST",   "/v1/messages",                       (401, 401, 401, 503, 401, 403, 401, 401, 401),
        {"model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
    # Counting needs the model's tokenizer, which the seeded model's directory does not hold (501).
    Row("POST",   "/v1/messages/count_tokens",          (401, 401, 401, 501, 401, 403, 401, 401, 401),
        {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}),
    # vLLM's tokenize and detokenize, at its paths and under /v1: the seeded model's tokenizer
    # is not on this machine (501), as for count_tokens.
    Row("POST",   "/tokenize",                          (401, 401, 401, 501, 401, 403, 401, 401, 401),
        {"model": "demo", "prompt": "hi"}),
    Row("POST",   "/v1/tokenize",                       (401, 401, 401, 501, 401, 403, 401, 401, 401),
        {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}),
    Row("POST",   "/detokenize",                        (401, 401, 401, 501, 401, 403, 401, 401, 401),
        {"model": "demo", "tokens": [1, 2]}),
    Row("POST",   "/v1/detokenize",                     (401, 401, 401, 501, 401, 403, 401, 401, 401),
        {"model": "demo", "tokens": [1, 2]}),
    Row("POST",   "/v1/embeddings",                     (404, 404, 404, 404, 404, 404, 404, 404, 404), {}),
    # The request inspector: a deployment's last requests, for any signed-in user (as the deployment).
    Row("GET",    "/api/v1/deployments/{slug}/requests/", (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    # Usage per tenant: a user gets their own, staff everyone's.
    Row("GET",    "/api/v1/usage/",                     (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    # Batches in the management API: a user sees their own (the seeded one is the user's), staff
    # cancel; the seeded batch has an output file and no error file (404).
    Row("GET",    "/api/v1/batches/",                   (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("GET",    "/api/v1/batches/{id}/",              (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("POST",   "/api/v1/batches/{id}/cancel/",       (401, 403, 200, 401, 401, 401, 200, 403, 401)),
    Row("GET",    "/api/v1/batches/{id}/output/",       (401, 200, 200, 401, 401, 401, 200, 200, 401)),
    Row("GET",    "/api/v1/batches/{id}/errors/",       (401, 404, 404, 401, 401, 401, 404, 404, 401)),
    # The Batch API: files and batches are the key owner's, whichever of their keys asks (the
    # seeded ones are the user's). A body that is no upload or no batch is a 400: auth passed.
    Row("GET",    "/v1/files",                          (401, 401, 401, 200, 401, 200, 401, 401, 401)),
    Row("POST",   "/v1/files",                          (401, 401, 401, 400, 401, 400, 401, 401, 401), {}),
    Row("GET",    "/v1/files/{id}",                     (401, 401, 401, 200, 401, 200, 401, 401, 401)),
    Row("DELETE", "/v1/files/{id}",                     (401, 401, 401, 200, 401, 200, 401, 401, 401)),
    Row("GET",    "/v1/files/{id}/content",             (401, 401, 401, 200, 401, 200, 401, 401, 401)),
    Row("GET",    "/v1/batches",                        (401, 401, 401, 200, 401, 200, 401, 401, 401)),
    Row("POST",   "/v1/batches",                        (401, 401, 401, 400, 401, 400, 401, 401, 401), {}),
    Row("GET",    "/v1/batches/{id}",                   (401, 401, 401, 200, 401, 200, 401, 401, 401)),
    Row("POST",   "/v1/batches/{id}/cancel",            (401, 401, 401, 200, 401, 200, 401, 401, 401)),
    # Prometheus: its own token when METRICS_TOKEN is set, open when it is not.
    Row("GET",    "/metrics",                           (401, 401, 401, 401, 401, 401, 401, 401, 200)),
    Row("GET",    "/metrics",                           (200, 200, 200, 200, 200, 200, 200, 200, 200),
        metrics_token_set=False),
    Row("GET",    "/health",                            (200, 200, 200, 200, 200, 200, 200, 200, 200)),
    Row("GET",    "/healthz",                           (200, 200, 200, 200, 200, 200, 200, 200, 200)),
    Row("GET",    "/version",                           (200, 200, 200, 200, 200, 200, 200, 200, 200)),
]

# Websockets: "open" = accepted and sent what it streams; on /ws/generate/, accepted and a
# request for the demo model answered with that error code (no_ready_replica: admitted, the
# HTTP 503; model_not_allowed: the HTTP 403); 4401 = closed with that code and a reason;
# "refused" = the handshake is refused (a session cookie from a foreign origin).
NO_REPLICA, NOT_ALLOWED = "no_ready_replica", "model_not_allowed"
WS_ROWS = {
    #                  anon    user    staff   key         rvkd    other        sess        nocsrf     metrics
    "/ws/generate/": ("4401", "4401", "4401", NO_REPLICA, "4401", NOT_ALLOWED, NO_REPLICA, "refused", "4401"),
    "/ws/events/":   ("4401", "4401", "4401", "4401",     "4401", "4401",      "open",     "refused", "4401"),
    "/ws/metrics/":  ("4401", "4401", "4401", "4401",     "4401", "4401",      "open",     "refused", "4401"),
}
# fmt: on

# Routes without a row, and why.
NOT_IN_MATRIX = {
    "": "the console's HTML shell: public; everything it shows comes through /api/v1",
    "console pages": "the same shell under the console's own paths",
    "assets/(?P<path>.+)$": "the console's static files: public",
    "static/(?P<path>.+)$": "the apps' static files (admin, Swagger UI): public",
    "admin/": "Django's admin: its own staff sign-in and CSRF checks (Django's)",
    "api-auth/": "DRF's browsable-API sign-in pages (Django's LoginView/LogoutView and their CSRF checks)",
}


def _route_key(route: str) -> str:
    if route == CONSOLE_PAGES.removeprefix("^"):
        return "console pages"
    for prefix in ("admin/", "api-auth/"):
        if route.startswith(prefix):
            return prefix
    return route


def _routes(patterns, prefix: str = ""):
    """Every route of the URL conf, spelled as a ResolverMatch's `route` (no regex anchors)."""
    for pattern in patterns:
        route = prefix + str(pattern.pattern).removeprefix("^")
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern.url_patterns, route)
        else:
            yield route


def test_every_route_and_operation_has_a_row():
    """A new endpoint fails here until the table says who may call it."""
    rows = {(row.method, row.path.split("?")[0]) for row in ROWS}
    spec = SchemaGenerator().get_schema(request=None, public=True)
    operations = {(method.upper(), path) for path, item in spec["paths"].items() for method in item}
    assert operations - rows == set(), "operations without a row"

    covered = {resolve(row.path.split("?")[0].format(id=1, slug="demo")).route for row in ROWS}
    missing = {
        route
        for route in _routes(get_resolver().url_patterns)
        if route not in covered and _route_key(route) not in NOT_IN_MATRIX
    }
    assert missing == set(), "routes without a row"
    assert {str(p.pattern) for p in websocket_urlpatterns} == {path.strip("/") + "/" for path in WS_ROWS}


# -- the world the table is about ---------------------------------------------------------------


@pytest.fixture
def seeded(staff, user) -> dict:
    """The demo deployment (running, its one replica still starting: nothing is ready), another
    deployment, one object of each kind, and the callers' credentials."""
    node = register_node(
        name="node-a",
        hostname="host-a",
        devices=[{"index": 0, "kind": "cuda", "name": "H200", "memory_total": 141 << 30}],
    )
    tiny = Model.objects.create(name="tiny", source="/models/tiny", status=Model.Status.READY)
    spare = Model.objects.create(name="spare", source="/models/spare", status=Model.Status.READY)
    policy = CachePolicy.objects.create(name="default")
    demo = Deployment.objects.create(slug="demo", model=tiny, cache_policy=policy)
    other = Deployment.objects.create(slug="other", model=tiny)
    replica = Replica.objects.create(deployment=demo, node=node, state=Replica.State.STARTING)
    staffs_key, _ = create_api_key(name="ops-key", owner=staff)
    record_event("deployment.created", demo, actor=staff)
    revoked, revoked_secret = create_api_key(name="revoked", owner=user)
    revoke_api_key(revoked)
    stored = StoredResponse.objects.create(id="resp_seeded", owner=user, conversation=[], response={"id": "x"})
    batch = Batch.objects.create(
        id="batch_seeded",
        owner=user,
        endpoint="/v1/chat/completions",
        model="demo",
        status=Batch.Status.IN_PROGRESS,
        expires_at=timezone.now() + timedelta(hours=24),
    )
    output = BatchFile.objects.create(
        id="file-seeded", owner=user, purpose="batch_output", filename="out.jsonl", batch=batch
    )  # its content: rendered from the batch's lines (none yet)
    Batch.objects.filter(pk=batch.pk).update(output_file=output)
    return {
        "ids": {
            "/api/v1/api-keys/": staffs_key.pk,
            "/api/v1/cache-policies/": policy.pk,
            "/api/v1/devices/": node.devices.get().pk,
            "/api/v1/events/": Event.objects.latest("id").pk,
            "/api/v1/models/": spare.pk,
            "/api/v1/nodes/": node.pk,
            "/api/v1/replicas/": replica.pk,
            "/v1/responses/": stored.pk,
            "/v1/files/": output.pk,
            "/v1/batches/": batch.pk,
            "/api/v1/batches/": batch.pk,
        },
        "bearer": {
            "user": create_token(user)[1],
            "staff": create_token(staff)[1],
            "key": create_api_key(name="app", owner=user)[1],
            "revoked": revoked_secret,
            "other_key": create_api_key(name="only-other", owner=user, allowed_deployments=[other])[1],
            "metrics_token": METRICS_TOKEN,
        },
    }


def concrete(path: str, ids: dict) -> str:
    if "{id}" in path:
        return path.format(id=next(pk for prefix, pk in ids.items() if path.startswith(prefix)))
    return path.format(slug="demo")


def browser(caller: str, staff, bearer: dict) -> tuple[Client, dict]:
    """A client for `caller` (CSRF checked as for a browser) and the headers it sends."""
    client = Client(enforce_csrf_checks=True)
    if caller in bearer:
        return client, {"HTTP_AUTHORIZATION": f"Bearer {bearer[caller]}"}
    if caller.startswith("session"):
        client.force_login(staff)
        if caller == "session":
            client.get("/api/v1/auth/me/")  # sets the csrftoken cookie, as for the console
            return client, {"HTTP_X_CSRFTOKEN": client.cookies["csrftoken"].value}
    return client, {}


def call(row: Row, caller: str, staff, seeded: dict) -> int:
    client, headers = browser(caller, staff, seeded["bearer"])
    path = concrete(row.path, seeded["ids"])
    if row.body is None:
        return client.generic(row.method, path, **headers).status_code
    return client.generic(row.method, path, json.dumps(row.body), "application/json", **headers).status_code


@pytest.mark.django_db
@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.label)
def test_http(row, staff, seeded):
    token = METRICS_TOKEN if row.metrics_token_set else ""
    actual = []
    with override_settings(SWITCHYARD={**settings.SWITCHYARD, "METRICS_TOKEN": token}):
        for caller in CALLERS:
            savepoint = transaction.savepoint()  # each cell starts from the same seeded world
            try:
                actual.append(call(row, caller, staff, seeded))
            finally:
                transaction.savepoint_rollback(savepoint)
    assert dict(zip(CALLERS, actual)) == dict(zip(CALLERS, row.expected))


@pytest.mark.django_db
def test_a_restricted_key_lists_only_its_deployments(seeded):
    """The other_key column's 200 on /v1/models: a list without the deployments it may not use."""
    client = Client(HTTP_AUTHORIZATION=f"Bearer {seeded['bearer']['other_key']}")
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["other"]
    everything = Client(HTTP_AUTHORIZATION=f"Bearer {seeded['bearer']['key']}")
    assert [m["id"] for m in everything.get("/v1/models").json()["data"]] == ["demo", "other"]


# -- websockets -----------------------------------------------------------------------------------


async def ws_outcome(path: str, caller: str, staff, bearer: dict) -> str:
    headers = []
    if caller in bearer:
        headers.append((b"authorization", f"Bearer {bearer[caller]}".encode()))
    elif caller.startswith("session"):
        browser = Client()
        await database_sync_to_async(browser.force_login)(staff)  # closes its connection after
        origin = b"http://localhost" if caller == "session" else b"http://evil.example"
        headers += [(b"cookie", f"sessionid={browser.cookies['sessionid'].value}".encode()), (b"origin", origin)]
    comm = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await comm.connect(timeout=5)
    if not connected:
        return str(code) if code == 4401 else "refused"
    try:
        if path == "/ws/generate/":
            await comm.send_json_to({"id": "r1", **CHAT})
        elif path == "/ws/metrics/":
            await get_channel_layer().group_send(METRICS_GROUP, {"type": "metrics.points", "points": {}})
        message = await comm.receive_output(timeout=5)
        if message["type"] == "websocket.close":
            return str(message["code"])
        if path == "/ws/generate/":
            reply = json.loads(message["text"])
            assert reply["type"] == "error" and reply["id"] == "r1", reply
            return reply["error"]["code"]
        return "open"
    finally:
        await comm.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("path", list(WS_ROWS))
async def test_websocket(path, staff, seeded):
    actual = [await ws_outcome(path, caller, staff, seeded["bearer"]) for caller in CALLERS]
    assert dict(zip(CALLERS, actual)) == dict(zip(CALLERS, WS_ROWS[path]))
