from workers.engine.block_manager import BlockManager
from workers.engine.sampling_params import SamplingParams
from workers.engine.scheduler import Scheduler
from workers.engine.sequence import Sequence, SequenceStatus


def make(n_blocks=64, budget=8, max_seqs=8, block_size=4):
    return Scheduler(BlockManager(n_blocks, block_size), max_seqs, budget)


def run_step(sched):
    out = sched.schedule()
    for item in out.all:
        samples = item.samples
        sched.block_manager.mark_computed(item.seq, item.num_tokens)
        if samples:
            item.seq.token_ids.append(1)
    return out


def test_long_prompt_is_prefilled_in_chunks_under_the_token_budget():
    sched = make(budget=8)
    s = Sequence("a", list(range(20)), SamplingParams())
    sched.add(s)
    sizes = []
    for _ in range(3):
        out = run_step(sched)
        assert sum(i.num_tokens for i in out.all) <= 8
        sizes.append(out.all[0].num_tokens)
    assert sizes == [8, 8, 4]
    assert s.num_output_tokens == 1  # sampled only when the prompt was complete


def test_decodes_and_new_prefills_share_a_step():
    sched = make(budget=8)
    a = Sequence("a", [1, 2, 3], SamplingParams())
    sched.add(a)
    run_step(sched)
    b = Sequence("b", list(range(30)), SamplingParams())
    sched.add(b)
    out = run_step(sched)
    assert [i.seq.request_id for i in out.decodes] == ["a"]
    assert out.prefills[0].seq is b and out.prefills[0].num_tokens == 7


def test_preemption_frees_the_youngest_and_requeues_it_first():
    sched = make(n_blocks=4, budget=64, block_size=2)
    a = Sequence("a", [1, 2, 3], SamplingParams())
    b = Sequence("b", [4, 5, 6], SamplingParams())
    sched.add(a)
    sched.add(b)
    run_step(sched)  # prompts computed: each holds 2 blocks, all 4 used
    assert run_step(sched).preempted == []  # 4th token of each still fits its 2nd block
    out = run_step(sched)  # a's 5th token needs a 3rd block → b preempted
    assert out.preempted == [b]
    assert b.status is SequenceStatus.WAITING and b.block_table == [] and sched.waiting[0] is b
    assert [i.seq for i in out.all] == [a]


def test_max_num_seqs_limits_admission():
    sched = make(max_seqs=2, budget=100)
    for i in range(3):
        sched.add(Sequence(str(i), [1, 2], SamplingParams()))
    out = run_step(sched)
    assert len(out.all) == 2 and len(sched.waiting) == 1
