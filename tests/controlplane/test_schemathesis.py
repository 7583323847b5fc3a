"""The management API against its own OpenAPI schema (/api/schema/), fuzzed by schemathesis.

Every operation the schema lists is called in-process through Django's WSGI handler (the whole
middleware stack, the test database) as a staff user with a management token, with generated
valid (positive) and invalid (negative) parameters and bodies: with generated path parameters
(mostly objects that do not exist) and with those of real seeded objects. Each response must be
no server error, have a status code, content type, body and headers the schema declares for
it, 4xx errors included. Nothing is excluded: the actions (start, stop, drain, ...) only write
rows and send Celery messages after commit, and each example runs in a savepoint rolled back
after it, so every example sees the same seeded objects and none is sent.

Deterministic and bounded: Hypothesis derandomized (a fixed seed per operation), no example
database, MAX_EXAMPLES per operation and variant.
"""

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
import schemathesis
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections, transaction
from django.utils import timezone
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from controlplane.batches.models import Batch
from controlplane.catalog.models import Model
from controlplane.common.services import create_token
from controlplane.deployments.models import CachePolicy, Deployment, Replica
from controlplane.events.models import Event
from controlplane.events.services import record_event
from controlplane.gateway.services import create_api_key
from controlplane.inventory.services import register_node

pytestmark = pytest.mark.django_db

MAX_EXAMPLES = 10
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
# Hypothesis' health checks judge how fast data is generated, which depends on the machine's
# load, not on the API; a slow example is still a valid one.
HYPOTHESIS = settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],  # failures are collected below, not raised: nothing to shrink
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture
def wsgi_app():
    """Django's WSGI handler, keeping the test's database connection between requests (as
    Django's test client does: each request would otherwise close it)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield WSGIHandler()
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def only_server_errors_logged():
    """Django logs every 4xx as a warning: hundreds here. 500s are still logged, with tracebacks."""
    logger = logging.getLogger("django.request")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@pytest.fixture
def seeded(staff) -> dict[str, dict]:
    """One object of each kind; the path parameters that name them, by path prefix."""
    node = register_node(
        name="node-a",
        hostname="host-a",
        devices=[{"index": 0, "kind": "cuda", "name": "H200", "memory_total": 141 << 30}],
    )
    model = Model.objects.create(
        name="tiny", source="/models/tiny", status=Model.Status.READY, architecture="LlamaForCausalLM"
    )
    policy = CachePolicy.objects.create(name="default")
    deployment = Deployment.objects.create(slug="demo", model=model, cache_policy=policy)
    replica = Replica.objects.create(deployment=deployment, node=node, state=Replica.State.READY)
    replica.devices.set(node.devices.all())
    key, _ = create_api_key(name="app", owner=staff, allowed_deployments=[deployment])
    record_event("deployment.created", deployment, actor=staff)
    expires = timezone.now() + timedelta(hours=24)
    batch = Batch.objects.create(id="batch_seeded", owner=staff, endpoint="/v1/chat/completions", model="demo",
                                 status=Batch.Status.IN_PROGRESS, expires_at=expires)  # fmt: skip
    return {
        "/api/v1/batches/": {"id": batch.pk},
        "/api/v1/api-keys/": {"id": key.pk},
        "/api/v1/cache-policies/": {"id": policy.pk},
        "/api/v1/deployments/": {"slug": deployment.slug},
        "/api/v1/devices/": {"id": node.devices.get().pk},
        "/api/v1/events/": {"id": Event.objects.latest("id").pk},
        "/api/v1/models/": {"id": model.pk},
        "/api/v1/nodes/": {"id": node.pk},
        "/api/v1/replicas/": {"id": replica.pk},
    }


def variants(operation, seeded: dict) -> list[tuple[GenerationMode, dict | None]]:
    """Valid requests with generated path parameters; then, on an object's path, valid and
    invalid requests naming a real object (invalid ones naming none would only be 404s);
    elsewhere invalid requests, where there is anything to get wrong."""
    found = [(GenerationMode.POSITIVE, None)]
    if "{" in operation.path:
        params = next(v for prefix, v in seeded.items() if operation.path.startswith(prefix))
        found += [(GenerationMode.POSITIVE, params), (GenerationMode.NEGATIVE, params)]
    elif operation.query or operation.body:
        found.append((GenerationMode.NEGATIVE, None))
    return found


@dataclass
class Results:
    examples: Counter = field(default_factory=Counter)  # by operation
    statuses: Counter = field(default_factory=Counter)  # of conforming responses
    failures: dict[str, str] = field(default_factory=dict)  # the first of each variant


def fuzz(operation, mode: GenerationMode, path_parameters: dict | None, auth: dict, results: Results) -> None:
    label = f"{operation.label} [{mode.value}{', seeded' if path_parameters else ''}]"

    @given(case=operation.as_strategy(generation_mode=mode, path_parameters=path_parameters))
    @HYPOTHESIS
    def call(case):
        results.examples[operation.label] += 1
        savepoint = transaction.savepoint()
        try:
            response = case.call_and_validate(headers=auth, checks=CHECKS)
            results.statuses[response.status_code] += 1
        except (FailureGroup, AssertionError) as exc:  # schemathesis' failures (one, or a group)
            results.failures.setdefault(label, f"{exc}\n    {case.as_curl_command(headers=auth)}")
        finally:
            transaction.savepoint_rollback(savepoint)

    try:
        call()
    except Unsatisfiable:
        results.failures[label] = "schemathesis could not generate a request"


def test_management_api_conforms_to_its_openapi_schema(wsgi_app, staff, seeded, only_server_errors_logged):
    auth = {"Authorization": f"Bearer {create_token(staff)[1]}"}
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", wsgi_app, headers=auth)
    operations = [result.ok() for result in schema.get_all_operations()]
    results = Results()
    started = time.monotonic()
    for operation in operations:
        for mode, path_parameters in variants(operation, seeded):
            fuzz(operation, mode, path_parameters, auth, results)
    took = time.monotonic() - started

    statuses = results.statuses
    print(
        f"schemathesis: {len(operations)} operations, {results.examples.total()} examples in {took:.1f} s; "
        f"statuses {dict(sorted(statuses.items()))}"
    )
    assert not results.failures, "\n\n".join(f"{label}: {message}" for label, message in results.failures.items())
    assert all(results.examples[op.label] for op in operations), results.examples
    # The fuzzing reached the API's logic, not only its refusals.
    assert statuses[200] and statuses[201] and statuses[204] and statuses[400] and statuses[404]
