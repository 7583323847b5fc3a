"""Speculation that decides from what it measures (speculative/cost_model.py): given step-time
tables and acceptance histories the chosen k per sequence is the expected-throughput maximum,
k = 0 when verifying costs more than the accepted guesses save; and an engine with
`choose_k: "measured"` switches drafting per step as its batch grows and shrinks, without
changing an output; and `auto` (lookup or the head, k measured) leaves every output as it is."""

from __future__ import annotations

import itertools
import random

import pytest

from tests.engine.test_compose import DEMO
from tests.engine.test_speculative_decode import BatchLog, assert_same, generate, make
from workers.engine import LLM, RequestError, SamplingParams
from workers.engine.speculative import cost_model
from workers.engine.speculative.config import NO_BATCH_LIMIT, SpeculativeConfig
from workers.engine.speculative.cost_model import Acceptance, StepCosts, choose, expected_tokens

DEMO_DRAFT = "workers/demo/draft"


def costs_from(table: dict[int, dict[int, float]], draft: dict[int, float] | None = None) -> StepCosts:
    """A StepCosts holding exactly `table` (bucket -> q -> seconds) and draft seconds per position."""
    costs = StepCosts()
    for b, row in table.items():
        for q, seconds in row.items():
            costs.record_step(b, q * b, seconds)
    for b, seconds in (draft or {}).items():
        costs.record_draft(b, 1, seconds)
    return costs


def rate_of(ks, rates, costs: StepCosts, batch_size: int) -> float:
    tokens = batch_size + sum(expected_tokens(r, k) - 1 for r, k in zip(rates, ks, strict=True))
    seconds = costs.step_seconds(batch_size, sum(ks)) + costs.draft_seconds(batch_size) * max(ks)
    return tokens / seconds


def test_no_drafts_when_a_verify_costs_more_than_the_accepted_guesses_save():
    # The 2-core CPU's shape: any verify 1.6-1.8x a decode step; 30% of the guesses accepted.
    costs = costs_from({1: {1: 0.010, 2: 0.016, 4: 0.018}})
    choice = choose([[0.3] * 3], [3], costs, 1)
    assert choice.ks == [0]
    assert choice.rate == pytest.approx(100.0)
    assert choice.drafting != [0], "exploration still has a drafting choice to measure"


def test_not_drafting_is_priced_as_a_step_that_feeds_no_head():
    """The shape measured at batch 8 on the 2-core CPU with the demo head: a plain step that feeds
    the head 15 ms (5 of them feeding), one that feeds nothing 10 ms, a verify of 24 guesses 26.6 ms,
    2 ms a draft position, 60% of guesses accepted. Against the fed 15 ms, drafting looked worth it
    (0.55 against 0.53 tokens a ms) and the bench ran at 0.79x; against 10 ms it is not."""
    costs = StepCosts()
    for _ in range(3):
        costs.record_step(8, 8, 0.015, fed=True)
        costs.record_feed(8, 0.005)
        costs.record_step(8, 8 + 24, 0.0266, fed=True)
        costs.record_draft(8, 1, 0.002)
    rates, limits = [[0.6] * 3] * 8, [3] * 8
    choice = choose(rates, limits, costs, 8)
    assert choice.ks == [0] * 8 and choice.plain_seconds == pytest.approx(0.010)
    assert choice.rate == pytest.approx(8 / 0.010)
    # once a step that fed nothing was measured, that is the price of not drafting
    costs.record_step(8, 8, 0.020, fed=False)
    choice = choose(rates, limits, costs, 8)
    assert choice.plain_seconds == pytest.approx(0.020) and all(k > 0 for k in choice.ks)


def test_a_verify_measured_cheaper_than_a_smaller_one_counts_as_that_one():
    # measured at batch 8: 26 ms for 8 guesses, 15 ms for 21 (one quiet sample): noise, not a curve
    costs = costs_from({8: {1: 0.009, 2: 0.026}})  # 0 guesses (one query token each), 8 guesses
    costs.record_step(8, 8 + 21, 0.015)
    assert costs.step_seconds(8, 21) == pytest.approx(0.026)
    assert costs.step_seconds(8, 4) == pytest.approx(0.0175)  # half way from 9 to 26 ms


def test_all_guesses_when_a_verify_costs_about_a_decode_step():
    # A GPU's shape: a verify costs 1.1x a decode step.
    costs = costs_from({1: {1: 0.010, 4: 0.011}})
    assert choose([[0.8] * 3], [3], costs, 1).ks == [3]


def test_each_sequence_drafts_as_far_as_its_own_acceptance_pays():
    # Verify cost grows with the query tokens; a sequence that copies its prompt drafts more
    # than one whose guesses are mostly rejected.
    costs = costs_from({2: {1: 0.010, 2: 0.012, 3: 0.014, 4: 0.016}})
    copying, rejecting = [0.95, 0.95, 0.95], [0.1, 0.1, 0.1]
    ks = choose([copying, rejecting], [3, 3], costs, 2).ks
    assert ks[0] == 3 and ks[1] == 0


def test_the_choice_is_the_maximum_over_every_assignment():
    rng = random.Random(7)
    for trial in range(200):
        n = rng.randint(1, 3)
        limits = [rng.randint(0, 3) for _ in range(n)]
        if not any(limits):
            limits[0] = 1
        rates = [sorted((rng.random() for _ in range(3)), reverse=rng.random() < 0.5) for _ in range(n)]
        b = cost_model.bucket(n)
        decode = rng.uniform(0.005, 0.02)
        table = {b: {1: decode, **{q: decode * rng.uniform(0.9, 2.5) for q in (2, 4)}}}
        costs = costs_from(table, {b: rng.choice([0.0, decode * rng.uniform(0.05, 0.8)])})
        best = max(rate_of(ks, rates, costs, n) for ks in itertools.product(*(range(m + 1) for m in limits)))
        choice = choose(rates, limits, costs, n)
        assert all(0 <= k <= m for k, m in zip(choice.ks, limits, strict=True))
        assert choice.rate == pytest.approx(best, rel=1e-9), (trial, limits, rates, table)
        assert rate_of(choice.ks, rates, costs, n) == pytest.approx(best, rel=1e-9)


def test_nothing_measured_means_a_plain_step_first_then_a_verify_is_tried():
    costs = StepCosts()
    assert choose([[0.9] * 3], [3], costs, 1).ks == [0]  # measures the decode step
    costs.record_step(1, 1, 0.010)
    # A verify never measured is assumed to cost a decode step (a GPU's), so it is tried ...
    assert choose([[0.9] * 3], [3], costs, 1).ks == [3]
    costs.record_step(1, 4, 0.030)
    # ... and once measured expensive (3x a decode step: k = 1 would cost 1.67x), left.
    assert choose([[0.5] * 3], [3], costs, 1).ks == [0]


def test_step_times_are_interpolated_by_the_guesses_verified_and_smoothed():
    costs = costs_from({4: {1: 0.010, 3: 0.020}})  # plain steps, and 8 guesses verified at batch 4
    assert costs.step_seconds(3, 4) == pytest.approx(0.015)  # batch 3 counts in bucket 4
    assert costs.step_seconds(4, 16) == pytest.approx(0.030)  # beyond: the last slope
    assert costs.step_seconds(8, 0) is None
    # A step where one of 4 sequences verified one guess is a verify of 1, not a decode step.
    costs.record_step(4, 4 + 1, 0.011)
    assert costs.step_seconds(4, 0) == pytest.approx(0.010)
    assert costs.step_seconds(4, 1) == pytest.approx(0.011)
    costs.record_step(4, 4, 0.020)  # one slow decode step moves the average a fifth of the way
    assert costs.step_seconds(4, 0) == pytest.approx(0.012)


def test_acceptance_by_position_from_the_prior_and_the_sequence():
    history = Acceptance()
    for _ in range(10):
        history.record(3, 3)  # every guess accepted
    for _ in range(10):
        history.record(3, 0)  # the first rejected: positions 1 and 2 never judged
    prior = history.rates(3, weight=1.0)
    assert prior[0] == pytest.approx((0.6 + 10) / 21)  # judged 20 times, accepted 10
    assert prior[1] == pytest.approx((0.6 + 10) / 11)  # judged 10 times, accepted 10
    own = Acceptance()
    own.record(3, 0)
    own.record(3, 0)
    mine = own.rates(3, prior)
    assert mine[0] < prior[0] and mine[1] == pytest.approx(prior[1])
    assert expected_tokens([0.5, 0.5, 0.5], 3) == pytest.approx(1.875)


def test_configuration(llama_dir):
    config = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3, "choose_k": "measured"})
    assert config.choose_k == "measured" and config.disable_by_batch_size == NO_BATCH_LIMIT
    fixed = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3})
    assert fixed.choose_k == "fixed" and fixed.disable_by_batch_size == 4
    with pytest.raises(RequestError, match="choose_k must be one of fixed, measured, got 'auto'"):
        SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3, "choose_k": "auto"})


class FixedCosts(StepCosts):
    """Step costs that do not learn: the engine's own timings on a loaded 2-core machine cannot
    be made to say what a test needs, so the table is given and measurements are dropped."""

    def record_step(self, *args, **kwargs) -> None:
        pass

    def record_draft(self, *args) -> None:
        pass

    def record_feed(self, *args) -> None:
        pass


class NeverLoses(cost_model.Realized):
    """A realized check that never turns drafting off: the test's table alone decides."""

    def drafting_loses(self, *args) -> bool:
        return False


class LosesAbove(cost_model.Realized):
    """A realized check whose verdict is given: drafting lost at batch sizes above `batch`."""

    def __init__(self, batch: int):
        super().__init__()
        self.batch = batch

    def drafting_loses(self, batch_size: int, prompt_share: float) -> bool:
        return batch_size > self.batch


class RecordingCosts(FixedCosts):
    """Given costs that keep a list of the steps the engine timed: (batch, query tokens, fed)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[int, int, bool]] = []

    def record_step(self, batch_size: int, query_tokens: int, seconds: float, fed: bool = False) -> None:
        self.steps.append((batch_size, query_tokens, fed))


def test_the_engine_drafts_per_step_as_the_batch_grows_and_shrinks(checkpoint_factory, monkeypatch):
    monkeypatch.setattr(cost_model, "EXPLORE_EVERY", 10**9)  # no exploring step in this test
    model_dir = checkpoint_factory("qwen3")
    llm = make(model_dir, True, spec={"choose_k": "measured"})
    engine = llm.engine
    engine.speculator.realized = NeverLoses()
    # Alone, a verify costs less than a decode step (any acceptance pays); with two or more
    # running, 100x (nothing pays).
    costs = FixedCosts()
    StepCosts.record_step(costs, 1, 1, 1.0)
    StepCosts.record_step(costs, 1, 4, 0.5)
    for b in (2, 4):
        StepCosts.record_step(costs, b, b, 1.0)
        StepCosts.record_step(costs, b, 4 * b, 100.0)
    engine.speculator.costs = costs
    log = BatchLog(engine)
    prompts = [[7] * 10, [7] * 10 + [8], [7] * 10 + [9]]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (40, 12, 12)]
    got = generate(llm, prompts, params)
    want = generate(make(model_dir, False), prompts, params)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    many = [step for step in log.steps if len(step) > 1]
    alone = [step for step in log.steps if len(step) == 1]
    assert many and not any(d for step in many for _, d in step)
    assert any(d for step in alone for _, d in step), "alone, it drafts again"
    stats = engine.speculation_stats()
    chosen = stats["chosen_k"]
    assert chosen[0] > 0 and sum(chosen[1:]) > 0
    # Expected against measured gain, over the steps the choice drafted in (alone: a plain step
    # costs 1.0 s in this table, so each token emitted there counts 1.0 plain second).
    drafting_steps = sum(1 for step in alone if any(d for _, d in step))
    gain = stats["gain_seconds"]
    assert drafting_steps <= gain["measured_plain"] <= 4 * drafting_steps  # 1 to k + 1 tokens a step
    assert gain["expected_plain"] > gain["expected"] > 0  # it drafts only where it expects a gain
    assert stats["expected_speedup"] == pytest.approx(gain["expected_plain"] / gain["expected"])
    assert stats["measured_speedup"] == pytest.approx(gain["measured_plain"] / gain["measured"])


def test_the_realized_check_compares_what_drafting_and_plain_steps_yielded():
    realized = cost_model.Realized()
    for _ in range(16):
        realized.add(8, "drafting", 20, 0.010)  # 2000 tokens a second
    for _ in range(3):
        realized.add(7, "plain", 8, 0.004)  # bucket 8 too: 2000 tokens a second
    assert not realized.drafting_loses(8, 0.0), "3 plain steps are too few to judge by"
    realized.add(5, "plain", 8, 0.004)
    assert realized.rate(6, "plain") == pytest.approx(2000) and realized.rate(8, "drafting") == pytest.approx(2000)
    assert not realized.drafting_loses(8, 0.0), "a tie is not a loss"
    # the prompts' feeding charged to drafting's tokens: 20 / (0.010 + 20 * 0.0001) = 1667 a second
    assert realized.rate(8, "drafting", 0.0001) == pytest.approx(20 / 0.012)
    assert realized.drafting_loses(8, 0.0001)
    assert not realized.drafting_loses(4, 0.0001), "another bucket knows nothing yet"
    # a step's tokens and seconds are averaged apart, so a long step weighs more than a short one
    for _ in range(200):
        realized.add(8, "plain", 8, 0.002)
    assert realized.rate(8, "plain") == pytest.approx(4000, rel=1e-3) and realized.drafting_loses(8, 0.0)
    realized.forget(8, "drafting")
    assert realized.rate(8, "drafting") is None and not realized.drafting_loses(8, 0.0)


def test_a_prompt_s_feeding_is_charged_to_the_tokens_drafting_emits():
    """Batch 8, verifying 24 guesses costs 2.5 plain steps and 80% of guesses are accepted: two
    guesses each yield 19.5 tokens in 8 ms against 8 in 4 ms, so drafting pays. But each
    request's prompt took 2 ms to feed the head and its answer is 10 tokens: 0.2 ms a token while
    drafting goes on, and then no draft pays (19.5 tokens take 11.9 ms)."""
    costs = StepCosts()
    costs.record_step(8, 8, 0.004)
    costs.record_step(8, 8 + 24, 0.010)
    rates, limits = [[0.8] * 3] * 8, [3] * 8
    assert costs.prompt_feed_per_token() == 0.0
    drafting = choose(rates, limits, costs, 8)
    assert drafting.ks == [2] * 8 and drafting.rate == pytest.approx((8 + 8 * 1.44) / 0.008)
    costs.record_prompt_feed(0.002)
    costs.record_answer(10)
    assert costs.prompt_feed_per_token() == pytest.approx(0.0002)
    choice = choose(rates, limits, costs, 8)
    assert choice.ks == [0] * 8 and choice.rate == pytest.approx(8 / 0.004)
    assert choice.drafting == [2] * 8, "what exploring would draft"


def observed_rows(drafter) -> list[tuple[str, int, int]]:
    """Wrap a drafter's `observe`: a list, growing, of (request id, first position, rows) fed."""
    fed = []
    observe = drafter.observe

    def recording(entries):
        fed.extend((seq.request_id, start, len(rows)) for seq, start, rows in entries)
        observe(entries)

    drafter.observe = recording
    return fed


def test_the_head_reads_a_prompt_only_where_its_request_may_draft():
    """Where drafting lost (`LosesAbove(2)`), a batch size stops feeding the head after
    IDLE_AFTER choices to draft nothing, and the prompts prefilled there are not fed: the rows are
    kept until the request's first decode step, fed with it if the batch shrank to a size that
    feeds the head, and dropped if not. Alone (drafting pays), the prompt is fed with its prefill.
    Outputs are the plain engine's."""
    spec = {"method": "auto", "num_speculative_tokens": 3, "model": DEMO_DRAFT}
    llm = LLM(DEMO, device="cpu", dtype="float32", speculative_config=spec)
    engine = llm.engine
    engine.speculator.realized = LosesAbove(2)
    fed = observed_rows(engine.drafter.head)
    plain = LLM(DEMO, device="cpu", dtype="float32")
    prompts = [list(range(40 + i, 70 + i)) for i in range(12)]
    length = len(prompts[0])

    def run(rid: str, batch: list[list[int]], max_tokens: list[int]) -> None:
        params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_tokens]
        for i, (prompt, p) in enumerate(zip(batch, params, strict=True)):
            engine.add_request(f"{rid}{i}", prompt, p)
        got: dict[str, list[int]] = {}
        while engine.has_unfinished_requests():
            for delta in engine.step():
                got.setdefault(delta.request_id, []).extend(delta.new_token_ids)
        want = generate(plain, batch, params)
        assert [got[f"{rid}{i}"] for i in range(len(batch))] == [w.token_ids for w in want]

    def rows_of(rid: str) -> list[tuple[int, int]]:
        return [(start, n) for r, start, n in fed if r == rid]

    run("alone", prompts[:1], [12])
    assert rows_of("alone0")[0] == (0, length), "alone, the prompt is fed in its prefill step"
    run("warm", prompts[1:5], [12] * 4)  # four decoding: drafting lost there, the bucket goes idle
    assert engine.speculator.idle_choices[4] >= cost_model.IDLE_AFTER
    run("idle", prompts[5:9], [12] * 4)
    assert all(start >= length for i in range(4) for start, _ in rows_of(f"idle{i}")), "no prompt fed at 4"
    # Three prefilled together (bucket 4, idle: the prompts are kept); two end with their second
    # token, so after the first decode step one runs alone, where the head is fed: the third's
    # prompt comes with that step's row. (A step feeds for the batch it leaves running.)
    engine.speculator.idle_choices[1] = 0  # alone, the head is fed (these made-up prompts aside)
    run("shrank", prompts[9:12], [2, 2, 12])
    assert rows_of("shrank2")[0] == (0, length + 1)
    assert not rows_of("shrank0") and not rows_of("shrank1")
    assert not engine.speculator._prompts, "no prompt is kept past its first decode step"


class PromptCosts(StepCosts):
    """Step costs that keep a list of the prompt feedings and answer lengths recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[float] = []
        self.answers: list[int] = []

    def record_prompt_feed(self, seconds: float) -> None:
        self.prompts.append(seconds)
        super().record_prompt_feed(seconds)

    def record_answer(self, tokens: int) -> None:
        self.answers.append(tokens)
        super().record_answer(tokens)


def test_the_prompt_share_counts_each_prompt_once_and_only_answers_that_ended_as_asked():
    """A prompt prefilled in chunks (16 tokens a step) is one sample of its feeding, not one a
    chunk; an answer's length counts when it ended as asked, not when it was aborted."""
    spec = {"method": "auto", "num_speculative_tokens": 3, "model": DEMO_DRAFT}
    llm = LLM(DEMO, device="cpu", dtype="float32", speculative_config=spec, max_num_batched_tokens=16)
    engine = llm.engine
    costs = engine.speculator.costs = PromptCosts()
    for i, max_tokens in enumerate((6, 9, 40)):
        engine.add_request(str(i), list(range(40 + i, 80 + i)), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    while len(costs.answers) < 2:
        engine.step()
    engine.abort_request("2")
    while engine.has_unfinished_requests():
        engine.step()
    assert len(costs.prompts) == 3 and all(seconds > 0 for seconds in costs.prompts)
    assert sorted(costs.answers) == [6, 9]
    assert costs.prompt_feed_per_token() > 0


def test_a_step_that_explores_not_drafting_feeds_the_head_after_it(monkeypatch):
    """Every 3rd choice explores: where drafting is the best choice, it drafts nothing, and then
    it feeds the head nothing either, so its time is a plain unfed step's (recorded fed=False).
    Its rows are fed before the next draft: the head sees every position in order, no gap, and
    keeps drafting. Outputs are the plain engine's."""
    monkeypatch.setattr(cost_model, "EXPLORE_EVERY", 3)
    spec = {"method": "auto", "num_speculative_tokens": 3, "model": DEMO_DRAFT}
    llm = LLM(DEMO, device="cpu", dtype="float32", speculative_config=spec)
    engine = llm.engine
    costs = RecordingCosts()
    StepCosts.record_step(costs, 1, 1, 1.0)
    StepCosts.record_step(costs, 1, 4, 0.5)  # a verify costs half a decode step: drafting pays
    engine.speculator.costs = costs
    engine.speculator.realized = NeverLoses()
    fed = observed_rows(engine.drafter.head)
    prompt = list(range(40, 70))
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    got = generate(llm, [prompt], params)
    assert got[0].token_ids == generate(LLM(DEMO, device="cpu", dtype="float32"), [prompt], params)[0].token_ids
    plain_unfed = [s for s in costs.steps if s == (1, 1, False)]
    assert plain_unfed, "an explored plain step, timed unfed"
    position = 0
    for _, start, rows in fed:
        assert start == position, "each entry continues where the last ended"
        position += rows
    assert position >= len(prompt) + 30 - 4  # up to the last verify's accepted tokens
    assert engine.speculation_stats()["num_drafts"] >= 3


@pytest.mark.parametrize("head", ["without a head", "with the demo head"])
def test_auto_is_lossless_and_drafts_from_lookup_or_the_head(head):
    """`auto`: prompt lookup where the context repeats, the head elsewhere, k from the measured
    costs. Whatever it chooses, greedy output equals the plain engine's; the first verify is
    always tried (its cost is unknown until then), so something was drafted."""
    spec = {"method": "auto", "num_speculative_tokens": 3}
    if head == "with the demo head":
        spec["model"] = DEMO_DRAFT
    prompts = [[5, 9, 33, 100, 7, 8, 9, 10, 11] * 3, [3, 4], list(range(20, 70)) * 2]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=2)
    llm = LLM(DEMO, device="cpu", dtype="float32", speculative_config=spec)
    assert llm.engine.speculator.config.choose_k == "measured"
    got = generate(llm, prompts, params)
    want = generate(LLM(DEMO, device="cpu", dtype="float32"), prompts, params)
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
    stats = llm.engine.speculation_stats()
    assert stats["num_drafts"] >= 1 and sum(stats["chosen_k"][1:]) >= 1
    assert (llm.engine.drafter.head is None) == (head == "without a head")


def test_auto_configuration(llama_dir):
    with pytest.raises(RequestError, match="'auto' chooses k from measured costs: choose_k must be 'measured'"):
        SpeculativeConfig.from_dict({"method": "auto", "num_speculative_tokens": 3, "choose_k": "fixed"})
    with pytest.raises(RequestError, match="'auto' takes 'model'"):
        SpeculativeConfig.from_dict({"method": "auto", "num_speculative_tokens": 3, "model": ""})
    config = SpeculativeConfig.from_dict({"method": "auto", "num_speculative_tokens": 3, "prompt_lookup_min": 1})
    assert (config.choose_k, config.prompt_lookup_min, config.model) == ("measured", 1, None)
