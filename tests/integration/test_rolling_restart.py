"""A restart without downtime, through real processes: uvicorn (gateway), the control Celery
worker, Celery beat (the periodic reconcile that drains the old replica once its replacement is
ready), a node agent, and replica processes with the demo model. A steady client keeps asking
while the one-replica deployment is restarted; not one request fails."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.support.platform import platform
from tests.support.stack import wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.django_db]

QUESTION = [{"role": "user", "content": "What is the capital of Japan?"}]


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, tmp_path_factory):
    roll = {"slug": "roll", "replicas": 1, "max_num_seqs": 8}
    # The old replica must drain and stop by itself: on a loaded machine (a run with two test
    # processes) the stacks' 5 s before a stop turns into a kill was once too short.
    env = {"RECONCILE_INTERVAL": "1", "REPLICA_STOP_TIMEOUT": "30"}
    with platform(django_db_blocker, tmp_path_factory, "rolling", deployments=[roll], env=env,
                  model="demo-rolling", staff=True, beat=True, token=True) as p:  # fmt: skip
        yield p


class SteadyClient(threading.Thread):
    """Short greedy requests one after another until stopped (or a bounded count/time); every
    answer that is not a 200 with content is an error."""

    def __init__(self, base: str, key: str, limit: int = 2000, seconds: float = 240):
        super().__init__(daemon=True)
        self.base, self.key, self.limit, self.seconds = base, key, limit, seconds
        self.halt = threading.Event()
        self.served: list[int] = []  # the replica of each answer, in order
        self.errors: list[str] = []

    def run(self) -> None:
        deadline = time.monotonic() + self.seconds
        body = {"model": "roll", "messages": QUESTION, "temperature": 0, "max_tokens": 4}
        headers = {"Authorization": f"Bearer {self.key}"}
        with httpx.Client(base_url=self.base, headers=headers, timeout=60) as http:
            while not self.halt.is_set() and len(self.served) + len(self.errors) < self.limit:
                if time.monotonic() > deadline:
                    break
                try:
                    r = http.post("/v1/chat/completions", json=body)
                except httpx.HTTPError as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                if r.status_code == 200 and r.json()["choices"][0]["message"]["content"]:
                    self.served.append(int(r.headers["x-switchyard-replica"]))
                else:
                    self.errors.append(f"{r.status_code}: {r.text[:300]}")

    def count_from(self, replica_id: int) -> int:
        return self.served.count(replica_id)


def test_a_one_replica_deployment_restarted_under_a_steady_client_loses_no_request(stack):
    from controlplane.deployments.models import Replica

    old = stack.replica("roll")
    client = SteadyClient(stack.base, stack.key)
    client.start()
    try:
        wait_for(lambda: client.count_from(old.pk) >= 3 or client.errors, 60, "answers from the replica")
        restarted = httpx.post(
            f"{stack.base}/api/v1/deployments/roll/restart/",
            headers={"Authorization": f"Bearer {stack.token}"},
            timeout=30,
        )
        assert restarted.status_code == 200 and restarted.json()["generation"] == 2

        new = wait_for(
            lambda: Replica.objects.filter(deployment__slug="roll", generation=2, state="ready").first(),
            120,
            "the new replica to be ready",
        )
        # While the new one loaded, the old one kept answering (and still does until it drains).
        wait_for(
            lambda: Replica.objects.filter(pk=old.pk, state="stopped").exists() or client.errors,
            60,
            "the old replica to drain and stop",
        )
        answered_by_new = client.count_from(new.pk)
        wait_for(
            lambda: client.count_from(new.pk) >= answered_by_new + 3 or client.errors,
            60,
            "answers from the new replica after the old one stopped",
        )
    finally:
        client.halt.set()
        client.join(timeout=90)
    assert not client.is_alive()
    assert client.errors == [], client.errors[:5]
    assert client.count_from(old.pk) >= 3 and client.count_from(new.pk) >= 3
    # Replaced, not restarted in place: the old process drained and stopped.
    old = Replica.objects.get(pk=old.pk)
    assert old.state == "stopped" and old.pid is None
    assert "drained and stopped" in (stack.state / "logs" / f"replica-{old.pk}.log").read_text()
    # Served by the old replica, then (once the new one was ready) by either, finally by the new.
    assert client.served[0] == old.pk and client.served[-1] == new.pk
    assert set(client.served) == {old.pk, new.pk}
