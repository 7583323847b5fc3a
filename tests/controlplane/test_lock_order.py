"""Replica events and the reconciler lock in one order, deployment then replica, so the two
never deadlock (Postgres aborted a reconcile that way, and the stop it was sending was lost).

Two real transactions on the test's PostgreSQL: one holds the deployment as the reconciler does;
a replica event applied meanwhile waits on the deployment, not holding the replica, so the
reconciler can go on to lock the replica."""

import threading

import pytest
from django.db import connection, connections, transaction

from controlplane.catalog.services import register_model
from controlplane.deployments.models import Deployment, Replica
from controlplane.deployments.node_sync import apply_replica_event
from tests.support.stack import wait_for
from workers.protocol.control import ReplicaEvent

pytestmark = pytest.mark.django_db(transaction=True)


def blocked_on_a_lock(pid: int) -> bool:
    with connections["default"].cursor() as cursor:  # this thread's own connection
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return bool(row) and row[0] == "Lock"


def test_a_replica_event_waits_for_the_deployment_before_it_locks_the_replica(node, model_dir):
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's (the suite's database); SQLite locks the whole file")
    model = register_model(name="tiny", source=str(model_dir))
    dep = Deployment.objects.create(slug="demo", model=model)
    replica = Replica.objects.create(deployment=dep, node=node, state=Replica.State.STARTING)
    event_pid: list[int] = []
    done = threading.Event()

    def apply_event():
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                event_pid.append(cursor.fetchone()[0])
            apply_replica_event(ReplicaEvent(replica_id=replica.pk, kind="ready", node=node.name, pid=7))
        finally:
            connections["default"].close()
            done.set()

    with transaction.atomic():
        Deployment.objects.select_for_update().get(pk=dep.pk)  # the reconciler's first lock
        worker = threading.Thread(target=apply_event)
        worker.start()
        wait_for(lambda: event_pid and blocked_on_a_lock(event_pid[0]), 10, "the event to wait on a lock")
        # The event holds nothing the reconciler needs next: the replica locks at once.
        with connection.cursor() as cursor:
            cursor.execute("SELECT id FROM deployments_replica WHERE id = %s FOR UPDATE NOWAIT", [replica.pk])
            assert cursor.fetchone() == (replica.pk,)
        assert not done.is_set()
    worker.join(timeout=30)
    assert done.is_set()
    assert Replica.objects.get(pk=replica.pk).state == Replica.State.READY
