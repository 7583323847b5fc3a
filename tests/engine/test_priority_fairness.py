"""Priorities and fair sharing in the scheduler (scheduler.py, fair_share.py): who is admitted
first, who is preempted first, the tenants' virtual token counters, and outputs that stay the
same whatever the order."""

import pytest

from tests.engine.test_scheduler import run_step
from workers.engine import LLM, SamplingParams
from workers.engine.block_manager import BlockManager
from workers.engine.fair_share import FairShare
from workers.engine.scheduler import Scheduler
from workers.engine.sequence import Sequence, SequenceStatus
from workers.protocol.replica import Share


def make(n_blocks=64, budget=64, max_seqs=8, block_size=4, fair_share=True):
    return Scheduler(BlockManager(n_blocks, block_size), max_seqs, budget, fair_share=fair_share)


def seq(rid, prompt=(1, 2, 3), priority=0, tenant="", weight=1.0, max_tokens=16):
    s = Sequence(rid, list(prompt), SamplingParams(max_tokens=max_tokens))
    s.share = Share(priority, tenant, weight)
    return s


def test_waiting_requests_are_admitted_by_priority_then_arrival():
    sched = make(max_seqs=1)
    for rid, priority in [("late-low", 5), ("a", 0), ("urgent", -3), ("b", 0)]:
        sched.add(seq(rid, priority=priority))
    order = []
    while sched.has_unfinished():
        out = run_step(sched)
        for item in out.all:
            if item.seq.request_id not in order:
                order.append(item.seq.request_id)
            sched.finish(item.seq)
    assert order == ["urgent", "a", "b", "late-low"]


def test_without_priorities_the_queue_stays_first_come_first_served():
    sched = make(max_seqs=2)
    seqs = [seq(str(i), tenant=f"t{i % 3}") for i in range(5)]
    for s in seqs:
        sched.add(s)
    sched.fair.enabled = False
    assert [s.request_id for s in sched._admission_order()] == ["0", "1", "2", "3", "4"]


def test_memory_pressure_preempts_the_least_urgent_running_sequence_even_if_older():
    # 4 blocks of 2 tokens: two 3-token prompts take 2 blocks each, then the cache is full.
    sched = make(n_blocks=4, block_size=2)
    old_low = seq("old-low", (1, 2, 3), priority=1)
    young_high = seq("young-high", (4, 5, 6), priority=0)
    sched.add(old_low)
    sched.add(young_high)
    run_step(sched)
    run_step(sched)
    out = run_step(sched)  # each needs a 3rd block: the less urgent one goes, though it came first
    assert out.preempted == [old_low]
    assert old_low.status is SequenceStatus.WAITING and old_low.block_table == []
    assert [i.seq for i in out.all] == [young_high]


def test_equal_priorities_keep_the_youngest_as_the_victim():
    sched = make(n_blocks=4, block_size=2)
    a, b = seq("a", (1, 2, 3)), seq("b", (4, 5, 6))
    sched.add(a)
    sched.add(b)
    run_step(sched)
    run_step(sched)
    assert run_step(sched).preempted == [b]


def test_an_urgent_arrival_preempts_a_less_urgent_running_sequence_for_blocks():
    sched = make(n_blocks=4, block_size=2)
    low = seq("low", (1, 2, 3, 4, 5, 6, 7), priority=2)  # 4 blocks: the whole cache
    sched.add(low)
    run_step(sched)
    assert sched.block_manager.num_free_blocks == 0
    urgent = seq("urgent", (9, 8, 7), priority=-1)
    sched.add(urgent)
    out = run_step(sched)
    assert out.preempted == [low] and [i.seq for i in out.all] == [urgent]
    assert low.status is SequenceStatus.WAITING and low.num_preemptions == 1


def test_an_arrival_never_preempts_its_own_priority_or_a_more_urgent_one():
    for running_priority in (0, -1):
        sched = make(n_blocks=4, block_size=2)
        first = seq("first", (1, 2, 3, 4, 5, 6, 7), priority=running_priority)
        sched.add(first)
        run_step(sched)
        sched.add(seq("second", (9, 8, 7), priority=0))
        out = run_step(sched)
        assert out.preempted == [] and [i.seq for i in out.all] == [first]


def test_an_urgent_arrival_takes_a_slot_from_a_less_urgent_one_at_the_sequence_limit():
    sched = make(max_seqs=2)
    low = [seq(f"low{i}", priority=1) for i in range(2)]
    for s in low:
        sched.add(s)
    run_step(sched)
    urgent = seq("urgent", priority=0)
    sched.add(urgent)
    out = run_step(sched)
    assert out.preempted == [low[1]]
    assert [i.seq.request_id for i in out.all] == ["urgent"]  # its prompt's step is its own
    assert {i.seq.request_id for i in run_step(sched).all} == {"low0", "urgent"}


def test_a_step_computing_an_urgent_prompt_leaves_less_urgent_sequences_out():
    sched = make(budget=64)
    batch = [seq(f"batch{i}", priority=1) for i in range(3)]
    for s in batch:
        sched.add(s)
    run_step(sched)
    assert len(run_step(sched).decodes) == 3  # the batch decodes
    sched.add(seq("chat", (5, 6, 7, 8, 9), priority=0))
    out = run_step(sched)
    assert [i.seq.request_id for i in out.all] == ["chat"] and out.preempted == []
    assert all(s.block_table for s in batch)  # they keep their blocks
    nxt = run_step(sched)
    assert {i.seq.request_id for i in nxt.all} == {"chat", "batch0", "batch1", "batch2"}
    # A prompt of the same priority shares its step, as before.
    sched.add(seq("batch3", (9, 9, 9), priority=1))
    assert len(run_step(sched).all) == 5


def test_fair_sharing_admits_the_tenant_with_the_least_service_first():
    sched = make(max_seqs=1)
    heavy = [seq(f"heavy{i}", tenant="heavy", max_tokens=2) for i in range(6)]
    light = [seq(f"light{i}", tenant="light", max_tokens=2) for i in range(2)]
    for s in heavy + light:  # the heavy tenant's burst arrived first
        sched.add(s)
    order = []
    while sched.has_unfinished():
        for item in run_step(sched).all:
            if item.seq.request_id not in order:
                order.append(item.seq.request_id)
            if item.seq.num_output_tokens >= 2:
                sched.finish(item.seq)
    # First come first served would run all six heavy requests before the light ones.
    assert order[:4] == ["heavy0", "light0", "heavy1", "light1"]
    served = sched.fair.served
    assert served["heavy"] == [18, 12] and served["light"] == [6, 4]  # prompt 3 and 2 outputs each


def test_first_come_first_served_when_fair_sharing_is_off():
    sched = make(max_seqs=1, fair_share=False)
    for s in [seq(f"heavy{i}", tenant="heavy") for i in range(3)] + [seq("light0", tenant="light")]:
        sched.add(s)
    assert [s.request_id for s in sched._admission_order()] == ["heavy0", "heavy1", "heavy2", "light0"]


def test_counters_weigh_output_twice_and_divide_by_the_tenants_weight():
    fair = FairShare()
    a, b = seq("a", range(10), tenant="a"), seq("b", range(10), tenant="b", weight=2.0)
    fair.arrive(a)
    fair.arrive(b)  # both start at 0
    for s in (a, b):
        fair.charge_prompt(s)
        s.token_ids += [1, 2, 3]
        fair.charge_output(s)
        fair.charge_output(s)  # nothing new: nothing charged twice
    assert fair.counter("a") == 10 + 2 * 3
    assert fair.counter("b") == (10 + 2 * 3) / 2


def test_a_tenant_returning_from_idle_starts_at_the_smallest_active_counter():
    fair = FairShare()
    busy = [seq(f"busy{i}", range(40), tenant=t) for i, t in enumerate(["x", "y"])]
    for s in busy:
        fair.arrive(s)
    fair.charge_prompt(busy[0])  # x: 40
    busy[1].token_ids += [1] * 30
    fair.charge_output(busy[1])  # y: 60
    idle = seq("back", tenant="idle")
    fair.arrive(idle)
    assert fair.counter("idle") == 40  # lifted: its idle time banked no credit
    fair.leave(idle)
    fair.counters["idle"] = 100.0  # a counter above the floor is not lowered
    fair.arrive(seq("again", tenant="idle"))
    assert fair.counter("idle") == 100.0


def test_a_resumed_requests_earlier_output_is_not_charged_again():
    fair = FairShare()
    s = Sequence("r", [1, 2, 3], SamplingParams(), output_token_ids=[4, 5])
    fair.arrive(s)
    fair.charge_output(s)
    assert fair.counter("") == 0


@pytest.fixture(scope="module")
def tight_llm(llama_dir):
    # 24 blocks of 4 tokens: three 20-token prompts and their outputs do not all fit.
    return LLM(str(llama_dir), device="cpu", dtype="float32", block_size=4, num_kv_blocks=24)


def test_priorities_and_tenants_never_change_greedy_outputs(tight_llm, llama_dir):
    prompts = [list(range(10 + 7 * i, 30 + 7 * i)) for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    roomy = LLM(str(llama_dir), device="cpu", dtype="float32", block_size=4)
    want = [o.outputs[0].token_ids for o in roomy.generate([{"prompt_token_ids": p} for p in prompts], params)]

    engine = tight_llm.engine
    preemptions = engine.scheduler.num_preemptions
    got: dict[str, list[int]] = {}
    engine.add_request("r0", prompts[0], params, share=Share(3, "a"))
    engine.add_request("r1", prompts[1], params, share=Share(3, "b"))
    for delta in engine.step() + engine.step():
        got.setdefault(delta.request_id, []).extend(delta.new_token_ids)
    # Urgent arrivals while the less urgent ones run: they take their blocks.
    engine.add_request("r2", prompts[2], params, share=Share(-1, "c"))
    engine.add_request("r3", prompts[3], params, share=Share(0, "a", 4.0))
    while engine.has_unfinished_requests():
        for delta in engine.step():
            got.setdefault(delta.request_id, []).extend(delta.new_token_ids)
    assert engine.scheduler.num_preemptions > preemptions  # the case really preempted
    assert [got[f"r{i}"] for i in range(4)] == want
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_an_urgent_arrival_takes_the_budget_a_less_urgent_long_prompt_would_use():
    sched = make(budget=8, n_blocks=64)
    long = seq("long-batch", tuple(range(100)), priority=5)  # prefilled 8 tokens a step
    sched.add(long)
    run_step(sched)
    sched.add(seq("chat", (1, 2, 3), priority=0))
    out = run_step(sched)
    assert [i.seq.request_id for i in out.all] == ["chat"]  # not after the batch's remaining 11 chunks
    assert long.num_computed_tokens == 8 and long.status is SequenceStatus.RUNNING
    assert "long-batch" in {i.seq.request_id for i in run_step(sched).all}


def test_forked_samples_charge_their_shared_prompt_once(llama_dir):
    engine = LLM(str(llama_dir), device="cpu", dtype="float32", block_size=4, num_kv_blocks=64).engine
    engine.add_request(
        "r", list(range(10, 13)), SamplingParams(n=3, max_tokens=2, ignore_eos=True), share=Share(0, "t")
    )
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.fair.served["t"] == [3, 6]  # 3 prompt tokens once, 2 tokens per sample
