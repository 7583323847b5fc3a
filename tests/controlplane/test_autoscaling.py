"""The autoscaler: its rule on recorded telemetry (controlplane/autoscaling/policy.py), one
interval end to end on heartbeats written to Redis as replicas write them, advisory against
active mode, and its management API."""

from __future__ import annotations

import time

import pytest
from django.conf import settings as django_settings

from controlplane.autoscaling import services
from controlplane.autoscaling.models import Autoscaling
from controlplane.autoscaling.policy import Capacity, Demand, Settings, capacity, decide, estimate
from controlplane.catalog.services import register_model
from controlplane.common import redis as redis_client
from controlplane.deployments.models import Deployment, Replica
from controlplane.events.models import Event
from controlplane.inventory.services import register_node
from workers.protocol import replica as protocol
from workers.protocol.replica import ReplicaStatus
from workers.sim.profile import SimProfile

RULE = Settings(min_replicas=1, max_replicas=8, ttft_p90_ms=1000, itl_p90_ms=50, cooldown_seconds=300, tolerance=0.1)
CAP = Capacity(prefill_tokens_per_s=1000, decode_tokens_per_s=100, decode_batch=8)


def demand(prompt=0.0, output=0.0, waiting=0.0, ttft=None, itl=None) -> Demand:
    return Demand(prompt_tokens_per_s=prompt, output_tokens_per_s=output, mean_prompt_tokens=500,
                  mean_output_tokens=100, waiting=waiting, ttft_p90_ms=ttft, itl_p90_ms=itl)  # fmt: skip


# -- the rule -----------------------------------------------------------------------------------


def test_capacity_is_the_batch_that_meets_the_itl_slo_and_the_prefill_share():
    profile = SimProfile(0.01, 1e-4, 0.02, 1e-3, 1e-5, kv_bytes_per_token=1)
    cap = capacity(profile, RULE, demand(), max_num_seqs=64, kv_tokens=1 << 30)
    # context 500 + 50 tokens: a sequence adds 1e-3 + 550e-5 = 6.5 ms to a 20 ms step; 50 ms fits 4
    assert cap.decode_batch == 4
    assert cap.decode_tokens_per_s == pytest.approx(4 / (0.02 + 4 * 0.0065))
    assert cap.prefill_tokens_per_s == pytest.approx(0.8 * 500 / (0.01 + 1e-4 * 500))
    unreachable = capacity(profile, Settings(**{**RULE.__dict__, "itl_p90_ms": 15}), demand(), 64, 1 << 30)
    assert unreachable.decode_batch == 1  # an SLO below one step: a tighter SLO never means more capacity
    small = capacity(profile, RULE, demand(), max_num_seqs=2, kv_tokens=1 << 30)
    assert small.decode_batch == 2  # max_num_seqs bounds it
    assert capacity(profile, RULE, demand(), max_num_seqs=64, kv_tokens=1200).decode_batch == 2  # and the KV cache


def test_demand_above_capacity_scales_up_to_the_estimate_at_once():
    # 2000 prompt tok/s = 2 replicas' prefill, 300 output tok/s = 3 replicas' decode: 5 in all
    decision = decide(RULE, 2, demand(2000, 300), None, CAP)
    assert (decision.action, decision.rule, decision.replicas) == ("up", "up", 5)
    assert estimate(demand(2000, 300), None, CAP) == pytest.approx(5.0)
    assert "2000 tok/s" in decision.reason and "2 -> 5" in decision.reason


def test_a_rising_demand_is_predicted_one_interval_ahead_and_a_falling_one_is_not():
    rising = decide(RULE, 2, demand(0, 200), demand(0, 100), CAP)  # 200 + (200 - 100) = 300: 3 replicas
    assert rising.replicas == 3 and rising.estimate == pytest.approx(3.0)
    falling = decide(RULE, 2, demand(0, 200), demand(0, 400), CAP)
    assert falling.estimate == pytest.approx(2.0) and falling.action == "hold"


def test_within_the_tolerance_nothing_changes():
    rule = Settings(**{**RULE.__dict__, "max_replicas": 20, "tolerance": 0.1})
    hold = decide(rule, 10, demand(0, 1080), None, CAP)  # 10.8 needed: within 10% of 10
    assert (hold.action, hold.rule) == ("hold", "within_tolerance")
    assert decide(rule, 10, demand(0, 1150), None, CAP).replicas == 12  # 11.5: beyond it


def test_waiting_requests_or_a_broken_slo_scale_up_at_once_past_the_estimate():
    for breach in (demand(0, 10, waiting=3), demand(0, 10, ttft=2500), demand(0, 10, itl=80)):
        decision = decide(RULE, 2, breach, None, CAP, since_change=1)  # cooldown does not hold it back
        assert (decision.action, decision.rule, decision.replicas) == ("up", "burst", 3), decision
    assert "ITL p90 80 ms > SLO 50 ms" in decide(RULE, 2, demand(0, 10, itl=80), None, CAP).reason


def test_scale_down_waits_for_the_cooldown_and_goes_one_replica_at_a_time():
    low = demand(0, 50)  # half a replica
    early = decide(RULE, 4, low, None, CAP, since_change=100)
    assert (early.action, early.rule, early.replicas) == ("hold", "cooldown", 4) and "200 s more" in early.reason
    late = decide(RULE, 4, low, None, CAP, since_change=301)
    assert (late.action, late.rule, late.replicas) == ("down", "down", 3)
    assert decide(RULE, 4, low, None, CAP).replicas == 3  # never changed before: no cooldown to wait


def test_no_decision_while_a_change_is_in_progress():
    decision = decide(RULE, 2, demand(0, 900, waiting=5), None, CAP, changing="1 replica(s) starting")
    assert (decision.action, decision.rule, decision.replicas) == ("hold", "change_in_progress", 2)


def test_the_interval_after_a_change_settles_is_not_judged():
    """It measured the old replica count (a queue built before the new replicas were ready)."""
    decision = decide(RULE, 3, demand(0, 900, waiting=5), None, CAP, settling=True)
    assert (decision.action, decision.rule, decision.replicas) == ("hold", "settling", 3)


def test_bounds_min_max_and_the_room_on_the_nodes():
    rule = Settings(**{**RULE.__dict__, "min_replicas": 2, "max_replicas": 4})
    assert decide(rule, 4, demand(0, 900), None, CAP).rule == "bounds"  # 9 needed, max 4
    assert decide(rule, 3, demand(0, 900), None, CAP).replicas == 4
    assert decide(rule, 2, demand(0, 0), None, CAP).replicas == 2  # idle: stays at min
    assert decide(rule, 1, demand(0, 0), None, CAP).replicas == 2  # below min: up to it
    assert decide(rule, 6, demand(0, 0), None, CAP).replicas == 4  # above max: down to it
    roomless = decide(rule, 2, demand(0, 900), None, CAP, room=1)
    assert roomless.replicas == 3
    full = decide(rule, 2, demand(0, 900), None, CAP, room=0)
    assert (full.action, full.rule) == ("hold", "bounds") and "room on the nodes" in full.reason


# -- one interval on recorded heartbeats -----------------------------------------------------------

pytestmark = pytest.mark.django_db


@pytest.fixture
def deployment(db):
    model = register_model(name="tiny", source="org/tiny", source_type="hub")
    node = register_node(
        name="n1", hostname="h1", devices=[{"index": 0, "kind": "cpu", "name": "cpu", "memory_total": 8 << 30}]
    )
    dep = Deployment.objects.create(slug="auto", model=model, replicas=1, engine="sim")
    replica = Replica.objects.create(deployment=dep, node=node, state=Replica.State.READY)
    return dep, replica


def heartbeat(replica: Replica, finished: int, prompt: int, generated: int, waiting: int = 0, cached: int = 0) -> None:
    """What a replica writes to its status hash each heartbeat (workers/replica/server.py)."""
    histogram = {"buckets": [0.01, 0.1, 1.0], "counts": [finished, 0, 0, 0]}
    metrics = {"deployment": replica.deployment.slug, "role": "colocated", "requests_finished": finished,
               "prompt_tokens": prompt, "cached_prompt_tokens": cached, "generation_tokens": generated,
               "ttft_seconds": histogram, "itl_seconds": histogram}  # fmt: skip
    load = {"role": "colocated", "running": 1, "waiting": waiting, "kv_blocks_total": 1000, "kv_blocks_free": 900}
    status = ReplicaStatus("ready", time.time(), "inc-1", load=load, endpoint={}, metrics=metrics)
    redis_client.client().hset(protocol.status_key(replica.pk), mapping=status.to_hash())


@pytest.fixture
def clean_redis():
    client = redis_client.client()
    client.delete(services.PREVIOUS_KEY)
    yield client
    client.delete(services.PREVIOUS_KEY)


@pytest.mark.parametrize("mode", ["advisory", "active"])
def test_an_interval_of_heavy_load_scales_up_in_active_mode_and_only_recommends_in_advisory(
    deployment, clean_redis, mode
):
    dep, replica = deployment
    Autoscaling.objects.create(deployment=dep, enabled=True, mode=mode, max_replicas=3, itl_p90_ms=50)
    heartbeat(replica, finished=0, prompt=0, generated=0)
    assert services.tick(now=1000.0) == {}  # the first tick only starts the interval
    heartbeat(replica, finished=100, prompt=100 * 400, generated=100 * 50, waiting=6, cached=100 * 100)
    decisions = services.tick(now=1010.0)
    assert decisions["auto"]["action"] == "up" and decisions["auto"]["rule"] == "burst"
    auto = Autoscaling.objects.get(deployment=dep)
    # 400-token prompts of which 100 came from the prefix cache: 300 computed each
    assert auto.recommendation["demand"]["prompt_tokens_per_s"] == pytest.approx(3000)
    assert auto.recommendation["demand"]["mean_prompt_tokens"] == pytest.approx(300)
    assert auto.recommendation["demand"]["mean_output_tokens"] == pytest.approx(50)
    dep.refresh_from_db()
    events = Event.objects.filter(verb__startswith="autoscaling.")
    if mode == "active":
        assert dep.replicas == decisions["auto"]["replicas"] > 1 and auto.last_change_at is not None
        assert [e.verb for e in events] == ["autoscaling.scaled"]
    else:
        assert dep.replicas == 1  # nothing changed; last_change_at times the cooldown of what it recommends
        assert [e.verb for e in events] == ["autoscaling.recommended"]
    assert "requests waiting" in events[0].data["decision"]["reason"] and events[0].data["demand"]["waiting"] == 6
    heartbeat(replica, finished=200, prompt=200 * 400, generated=200 * 50, waiting=6, cached=200 * 100)
    services.tick(now=1020.0)
    if mode == "advisory":  # the same recommendation again: no second event
        assert Event.objects.filter(verb__startswith="autoscaling.").count() == 1
    else:  # the new replicas are on their way: no decision
        assert Autoscaling.objects.get().recommendation["decision"]["rule"] == "change_in_progress"


@pytest.mark.parametrize("how", ["disabled", "stopped", "disaggregated"])
def test_a_deployment_without_autoscaling_stopped_or_no_longer_colocated_is_left_alone(deployment, clean_redis, how):
    dep, replica = deployment
    Autoscaling.objects.create(deployment=dep, enabled=how != "disabled", mode="active")
    if how == "stopped":
        dep.desired_state = Deployment.DesiredState.STOPPED
    if how == "disaggregated":  # changed after autoscaling was enabled
        dep.mode = Deployment.Mode.DISAGGREGATED
    dep.save()
    heartbeat(replica, 0, 0, 0)
    services.tick(now=1000.0)
    heartbeat(replica, 100, 40000, 5000, waiting=6)
    assert services.tick(now=1010.0) == {}
    dep.refresh_from_db()
    assert dep.replicas == 1 and not Event.objects.filter(verb__startswith="autoscaling.").exists()


# -- the API ------------------------------------------------------------------------------------


def test_the_api_shows_defaults_takes_settings_and_refuses_what_cannot_work(staff_client, user_client, deployment):
    url = "/api/v1/deployments/auto/autoscaling/"
    got = staff_client.get(url).json()
    assert (got["enabled"], got["mode"], got["scale_down_cooldown_seconds"], got["tolerance"]) == (
        False,
        "advisory",
        300,
        0.1,
    )
    changed = staff_client.patch(url, {"enabled": True, "mode": "active", "max_replicas": 6}, format="json")
    assert changed.status_code == 200 and changed.json()["max_replicas"] == 6
    assert Autoscaling.objects.get().enabled and Event.objects.filter(verb="autoscaling.updated").exists()
    bad = staff_client.patch(url, {"min_replicas": 9}, format="json")
    assert bad.status_code == 400 and "above max_replicas 6" in str(bad.json())
    assert staff_client.patch(url, {"capacity_profile": "a100"}, format="json").status_code == 400
    assert staff_client.patch(url, {"min_replicas": 0}, format="json").status_code == 400  # nothing to scale up from
    assert staff_client.patch(url, {"mode": "eager"}, format="json").status_code == 400
    assert user_client.patch(url, {"enabled": False}, format="json").status_code == 403
    assert staff_client.get("/api/v1/deployments/nope/autoscaling/").status_code == 404
    dep = Deployment.objects.get(slug="auto")
    dep.mode = "disaggregated"
    dep.save()
    pd = staff_client.patch(url, {"enabled": True}, format="json")
    assert pd.status_code == 400 and "not built yet" in str(pd.json())
    assert django_settings.CELERY_BEAT_SCHEDULE["autoscale"]["task"] == "autoscaling.tick"
