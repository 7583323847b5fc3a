"""Every pair of engine features, in one generated matrix, and random batches mixing them all.

The dimensions below are crossed pairwise (all-pairs: every value of every dimension meets every
value of every other at least once), skipping only what the engine refuses by design. Each case
runs a small batch through the engine as the case configures it and checks the invariants every
feature owes the others:
  - nothing raises, and no request ends in an error;
  - greedy and seeded outputs equal the plain single-device engine's, token for token;
  - a constrained output that ended on its own (not cut by a stop string or max_tokens)
    validates against its grammar;
  - every KV block is free again afterwards, on every engine the case used.
`test_random_batches_keep_the_invariants` (hypothesis) mixes random valid requests in one batch.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.test_compose import DEMO, EAGLE3, GRAMMARS, QUESTIONS, validates
from tests.engine.test_speculative_decode import NGRAM
from workers.engine import LLM, SamplingParams
from workers.engine.config import EngineConfig
from workers.engine.llm_engine import LLMEngine
from workers.protocol.replica import DEFAULT_SHARE, Share

DIMENSIONS = {
    "speculation": ["none", "ngram", "eagle3", "auto"],
    "grammar": ["none", *sorted(GRAMMARS)],
    "n": ["1", "3"],
    "sampling": ["greedy", "seeded"],
    "logprobs": ["off", "on"],
    "penalties": ["off", "on"],
    "logit_bias": ["off", "on"],
    "stop": ["off", "on"],
    "ignore_eos": ["off", "on"],
    "mode": ["colocated", "disaggregated"],
    "tiers": ["none", "dram"],
    "tp": ["1", "2"],
    "preemption": ["off", "forced"],
    "resumed": ["off", "on"],
    # "mixed": each request of the batch has its own priority and tenant (scheduler.py)
    "share": ["plain", "mixed"],
}
# Pairs left out: what the engine refuses by design (a 400 at the gateway or at deployment
# creation), and one pair that needs processes, covered by tests/integration/test_pd_parallel.py
# (each rank of a tp=2 group holds half the KV heads; only Mooncake moves them rank to rank).
REFUSED = [
    ({"tiers": "dram", "tp": "2"}, "KV tiers with tensor/pipeline parallelism"),
    ({"n": "3", "resumed": "on"}, "a request of n > 1 is not resumed on another replica"),
    ({"mode": "disaggregated", "tp": "2"}, "covered between processes: tests/integration/test_pd_parallel.py"),
]
MAX_TOKENS = 20
RESUME_AFTER = 4  # tokens generated before the "failover"
SPECS = {
    "none": None,
    "ngram": {**NGRAM, "disable_by_batch_size": 16},
    "eagle3": {**EAGLE3, "disable_by_batch_size": 16},
    # Prompt lookup or the head per sequence, k per sequence and step from the measured costs
    # (speculative/auto.py, cost_model.py): any choice, 0 included, leaves every output as it is.
    "auto": {**EAGLE3, "method": "auto"},
}


def allowed(case: dict) -> bool:
    return not any(all(case.get(k) == v for k, v in refused.items()) for refused, _ in REFUSED)


def all_pairs(dimensions: dict[str, list[str]], allowed=allowed) -> list[dict[str, str]]:
    """A small set of cases covering every allowed pair of values of two dimensions. Greedy:
    each case starts from the first pair still uncovered, and fills each other dimension with
    the value that covers the most uncovered pairs (ties: the first listed). Deterministic."""
    names = list(dimensions)

    def pairs(case: dict) -> set:
        return {(a, case[a], b, case[b]) for a, b in itertools.combinations(names, 2) if a in case and b in case}

    uncovered = {
        (a, va, b, vb)
        for a, b in itertools.combinations(names, 2)
        for va in dimensions[a]
        for vb in dimensions[b]
        if allowed({a: va, b: vb})
    }
    cases = []
    while uncovered:
        a, va, b, vb = min(uncovered, key=lambda p: (names.index(p[0]), names.index(p[2]), p[1], p[3]))
        case = {a: va, b: vb}
        for name in names:
            if name in case:
                continue
            options = [v for v in dimensions[name] if allowed({**case, name: v})]
            case[name] = max(options, key=lambda v, case=case, name=name: len(pairs({**case, name: v}) & uncovered))
        uncovered -= pairs(case)
        cases.append({name: case[name] for name in names})
    return cases


# Ordered so that the cases of one parallel group run together (Engines.get starts each once).
CASES = sorted(all_pairs(DIMENSIONS), key=lambda c: (c["tp"], c["speculation"]))


def case_id(case: dict) -> str:
    return "-".join(
        f"{k}={v}" for k, v in case.items() if v not in ("none", "off", "1", "colocated", "greedy", "plain")
    )


def params_of(case: dict, tokenizer) -> SamplingParams:
    fields = {"max_tokens": MAX_TOKENS, "n": int(case["n"]), "ignore_eos": case["ignore_eos"] == "on"}
    if case["sampling"] == "greedy":
        fields["temperature"] = 0.0
    else:
        fields.update(temperature=1.3, top_p=0.95, seed=17)
    if case["grammar"] != "none":
        fields["grammar"] = GRAMMARS[case["grammar"]]
    if case["logprobs"] == "on":
        fields["logprobs"] = 2
    if case["penalties"] == "on":
        fields.update(repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2)
    if case["logit_bias"] == "on":
        fields["logit_bias"] = {tokenizer.encode(" the")[0]: 4.0, tokenizer.encode("a")[0]: -3.0}
    if case["stop"] == "on":
        fields["stop"] = ["e ", '",']
    return SamplingParams(**fields)


class Engines:
    """The engines the cases use, each built once for the module (a tp=2 group starts processes)."""

    def __init__(self):
        self.built: dict[tuple, LLMEngine] = {}

    def get(self, spec: str = "none", tiers: str = "none", tp: str = "1", role: str = "serve") -> LLMEngine:
        """`role` "prefill": a separate engine computing prompts for a disaggregated case."""
        key = (spec, tiers, tp, role)
        if key not in self.built and tp != "1":  # a process runs one parallel group at a time
            for other in [k for k in self.built if k[2] != "1"]:
                self.built.pop(other).close()
        if key not in self.built:
            self.built[key] = LLMEngine(
                EngineConfig(
                    model=DEMO,
                    dtype="float32",
                    block_size=4,
                    num_kv_blocks=160,  # small: blocks are evicted (to the DRAM tier, where there is one)
                    speculative_config=SPECS[spec],
                    kv_tiers={"dram_bytes": 8 << 20} if tiers == "dram" else None,
                    tensor_parallel_size=int(tp),
                )
            )
        return self.built[key]

    def close(self) -> None:
        for engine in self.built.values():
            engine.close()


@pytest.fixture(scope="module")
def engines():
    made = Engines()
    yield made
    made.close()


@pytest.fixture(scope="module")
def plain():
    return LLM(DEMO, device="cpu", dtype="float32", block_size=4)


def prompts(engine) -> list[list[int]]:
    return [engine.tokenizer.prompt_ids(messages=[{"role": "user", "content": q}]) for q in QUESTIONS[:2]]


class Outputs:
    """Each sample's tokens and text, by (request id, sample index), gathered from deltas."""

    def __init__(self):
        self.tokens: dict[tuple[str, int], list[int]] = {}
        self.text: dict[tuple[str, int], str] = {}
        self.finish: dict[tuple[str, int], tuple] = {}

    def add(self, deltas) -> None:
        for d in deltas:
            key = (d.request_id, d.index)
            assert d.finish_reason != "error", f"{key} failed in the engine: {d.error}"
            self.tokens.setdefault(key, []).extend(d.new_token_ids)
            self.text[key] = self.text.get(key, "") + d.new_text
            if d.finished:
                self.finish[key] = (d.finish_reason, d.stop_reason)


def drive(engine: LLMEngine, out: Outputs, preempt: bool = False) -> None:
    """Step until done; with `preempt`, preempt the newest running sequence after two steps
    (the scheduler's own path: its blocks are freed and it is recomputed later)."""
    steps = 0
    while engine.has_unfinished_requests():
        out.add(engine.step())
        steps += 1
        if preempt and steps == 2 and engine.scheduler.running:
            engine.scheduler._preempt(engine.scheduler.running[-1])
        assert steps < 2000, "the engine does not finish"


def handoff(
    prefill: LLMEngine, decode: LLMEngine, rid: str, prompt: list[int], params: SamplingParams, share=DEFAULT_SHARE
):
    """A disaggregated request: the prefill engine computes the prompt and the first token (as
    a prefill replica runs it: n=1, max_tokens=1), its KV is copied into blocks the decode
    engine reserved (what Mooncake does between replicas), and the decode engine takes over."""
    prefill.add_request(rid, prompt, dataclasses.replace(params, max_tokens=1, n=1), hold_blocks=True, share=share)
    first = None
    while first is None or not first.finished:
        (first,) = [d for d in prefill.step() if d.request_id == rid] or [first]
    need = prefill.block_manager.blocks_needed(len(prompt))
    dst = decode.reserve_blocks(len(prompt))
    assert dst is not None
    src = prefill.held[rid].block_table[:need]
    decode.runner.kv_cache[:, :, dst] = prefill.runner.kv_cache[:, :, src]
    prefill.release_held(rid)
    lp = first.new_logprobs[0] if first.new_logprobs else None
    return decode.add_prefilled_request(
        rid, prompt, params, dst, first.new_token_ids[0], lp, first.num_cached_tokens, share=share
    )


def run_case(case: dict, engines: Engines, plain: LLM) -> None:
    engine = engines.get(case["speculation"], case["tiers"], case["tp"])
    params = params_of(case, engine.tokenizer)
    ids = prompts(engine)
    want = plain.generate([{"prompt_token_ids": p} for p in ids], params)
    out = Outputs()
    resumed = case["resumed"] == "on"
    rids = [f"{case_id(case)}-{i}" for i in range(len(ids))]
    for i, (rid, prompt, ref) in enumerate(zip(rids, ids, want, strict=True)):
        # Mixed: the later request is the more urgent, of another tenant, so it goes first.
        share = Share(priority=-i, tenant=f"tenant-{i}", weight=1.0 + i) if case["share"] == "mixed" else DEFAULT_SHARE
        if resumed:  # the first tokens came from a replica that died; their text was sent
            head = ref.outputs[0]
            done = head.token_ids[:RESUME_AFTER]
            if len(head.token_ids) <= RESUME_AFTER:
                out.tokens[(rid, 0)], out.text[(rid, 0)] = list(head.token_ids), head.text
                out.finish[(rid, 0)] = (head.finish_reason, head.stop_reason)
                continue
            out.tokens[(rid, 0)] = list(done)  # none of their text was sent: it all comes from here
            engine.add_request(rid, prompt, params, output_token_ids=done, emitted_text_len=0, share=share)
        elif case["mode"] == "disaggregated":
            prefill = engines.get("none", case["tiers"], case["tp"], role="prefill")
            out.add([handoff(prefill, engine, rid, prompt, params, share)])
        else:
            engine.add_request(rid, prompt, params, share=share)
    drive(engine, out, preempt=case["preemption"] == "forced")
    for rid, ref in zip(rids, want, strict=True):
        for sample in ref.outputs:
            key = (rid, sample.index)
            assert out.tokens[key] == sample.token_ids, f"sample {sample.index} differs from the plain engine's"
            reason, stop_reason = out.finish[key]
            assert (reason, stop_reason) == (sample.finish_reason, sample.stop_reason)
            if case["grammar"] != "none" and reason == "stop" and stop_reason is None:
                assert validates(case["grammar"], sample.text), sample.text
    for used in engines.built.values():
        assert not used.requests and not used.held and not used.has_unfinished_requests()
        assert used.block_manager.num_free_blocks == used.block_manager.num_blocks


def test_the_matrix_covers_every_allowed_pair():
    covered = {(a, c[a], b, c[b]) for c in CASES for a, b in itertools.combinations(DIMENSIONS, 2)}
    for a, b in itertools.combinations(DIMENSIONS, 2):
        for va in DIMENSIONS[a]:
            for vb in DIMENSIONS[b]:
                assert ((a, va, b, vb) in covered) == allowed({a: va, b: vb})
    assert all(allowed(c) for c in CASES) and len(CASES) < 40


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) or "plain" for c in CASES])
def test_feature_pair(case, engines, plain):
    run_case(case, engines, plain)


GRAMMAR_CHOICES = ["none", *sorted(GRAMMARS)]


@st.composite
def requests(draw):
    """One random valid request: (prompt index, SamplingParams)."""
    grammar = draw(st.sampled_from(GRAMMAR_CHOICES))
    fields = {
        "max_tokens": draw(st.integers(1, 16)),
        "n": draw(st.sampled_from([1, 1, 2, 3])),
        "ignore_eos": draw(st.booleans()),
    }
    kind = draw(st.sampled_from(["greedy", "seeded", "random"]))
    if kind != "greedy":
        fields.update(temperature=draw(st.sampled_from([0.7, 1.0, 1.5])), top_k=draw(st.sampled_from([0, 5])))
        if kind == "seeded":
            fields["seed"] = draw(st.integers(0, 1000))
    else:
        fields["temperature"] = 0.0
    if grammar != "none":
        fields["grammar"] = GRAMMARS[grammar]
    if draw(st.booleans()):
        fields["logprobs"] = draw(st.integers(0, 3))
    if draw(st.booleans()):
        fields["repetition_penalty"] = draw(st.sampled_from([1.0, 1.2]))
        fields["presence_penalty"] = draw(st.sampled_from([0.0, 0.5]))
    if draw(st.booleans()):
        fields["logit_bias"] = {draw(st.integers(0, 300)): draw(st.sampled_from([-5.0, 3.0]))}
    if draw(st.booleans()):
        fields["stop"] = [draw(st.sampled_from(["e ", '",', "}", "the"]))]
    return draw(st.integers(0, len(QUESTIONS) - 1)), SamplingParams(**fields)


@pytest.mark.parametrize("spec", ["ngram", "eagle3"])
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(requests(), min_size=2, max_size=5), preempt=st.booleans())
def test_random_batches_keep_the_invariants(spec, batch, preempt, engines, plain):
    engine = engines.get(spec)
    ids = [engine.tokenizer.prompt_ids(messages=[{"role": "user", "content": q}]) for q in QUESTIONS]
    out = Outputs()
    rids = [f"prop-{spec}-{i}" for i in range(len(batch))]
    for rid, (which, params) in zip(rids, batch, strict=True):
        engine.add_request(rid, ids[which], params)
    drive(engine, out, preempt=preempt)
    reproducible = [
        (rid, which, p) for rid, (which, p) in zip(rids, batch, strict=True) if p.greedy or p.seed is not None
    ]
    want = plain.generate([{"prompt_token_ids": ids[w]} for _, w, _ in reproducible], [p for _, _, p in reproducible])
    for (rid, _, _), ref in zip(reproducible, want, strict=True):
        for sample in ref.outputs:
            assert out.tokens[(rid, sample.index)] == sample.token_ids
    for rid, (_, params) in zip(rids, batch, strict=True):
        for index in range(params.n):
            reason, stop_reason = out.finish[(rid, index)]
            assert len(out.tokens[(rid, index)]) <= params.max_tokens
            kind = params.grammar["type"] if params.grammar else None
            if kind and reason == "stop" and stop_reason is None:
                assert validates(kind, out.text[(rid, index)]), out.text[(rid, index)]
    assert not engine.requests and engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
