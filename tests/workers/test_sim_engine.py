"""The simulated engine (workers/sim): the real engine's scheduler and KV cache with step times
from a profile and deterministic tokens. Its replica-protocol tests are the real engine's own,
run on both (tests/workers/test_replica_kv_index.py, tests/integration/test_replica_bad_input.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from workers.demo import MODEL_DIR
from workers.engine import SamplingParams
from workers.engine.errors import RequestError
from workers.sim.engine import ANSWER_SPREAD, MIN_ANSWER, SimConfig, SimEngine
from workers.sim.profile import ProfileError, SimProfile, load_profile, shipped_profiles

INSTANT = SimProfile(0.0, 0.0, 0.0, 0.0, 0.0, kv_bytes_per_token=2048)


def engine(profile: SimProfile = INSTANT, **config) -> SimEngine:
    return SimEngine(SimConfig(model=str(MODEL_DIR), profile=profile, block_size=16, **config))


def run(sim: SimEngine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[tuple[str, int], list[int]]:
    """Add every request, step until none is left; each (request, sample)'s tokens."""
    for rid, (prompt, params) in requests.items():
        sim.add_request(rid, prompt, params)
    out: dict[tuple[str, int], list[int]] = {}
    steps = 0
    while sim.has_unfinished_requests():
        for delta in sim.step():
            out.setdefault((delta.request_id, delta.index), []).extend(delta.new_token_ids)
        steps += 1
        assert steps < 10_000
    return out


def greedy(n: int = 20, **extra) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **extra)


def test_the_same_prompt_gives_the_same_answer_anywhere_and_others_differ():
    prompts = {f"r{i}": (list(range(10 + i, 60 + i)), greedy()) for i in range(4)}
    first, second = run(engine(), prompts), run(engine(max_num_seqs=1), prompts)  # another batching
    assert first == second and all(len(tokens) == 20 for tokens in first.values())
    assert len({tuple(tokens) for tokens in first.values()}) == 4


def test_answers_end_with_eos_at_a_length_taken_from_the_prompt_unless_eos_is_ignored():
    sim = engine()
    params = SamplingParams(temperature=0.0, max_tokens=400)
    out = run(sim, {f"r{i}": (list(range(20, 40 + i)), params) for i in range(6)})
    lengths = {len(tokens) for tokens in out.values()}
    assert all(MIN_ANSWER < n <= MIN_ANSWER + ANSWER_SPREAD for n in lengths) and len(lengths) > 1
    assert all(tokens[-1] in sim.eos_token_ids for tokens in out.values())
    assert all(len(tokens) == 400 for tokens in run(engine(), {"r": (list(range(20, 40)), greedy(400))}).values())


def test_a_repeated_prompt_hits_the_prefix_cache():
    sim = engine()
    prompt = list(range(100, 180))  # 5 full blocks
    run(sim, {"a": (prompt, greedy(4))})
    seq = sim.add_request("b", prompt, greedy(4))
    run(sim, {})
    assert seq.num_cached_tokens == 64  # 4 of the 5 blocks: the last one holds the token to compute
    assert sim.stats()["prefix_cache_hits"] > 0


def test_a_full_cache_preempts_and_every_answer_is_as_it_would_be_alone():
    prompts = {f"r{i}": (list(range(5 + i, 70 + i)), greedy(40)) for i in range(6)}
    alone = run(engine(), prompts)
    crowded = engine(kv_cache_bytes=24 * 16 * 2048)  # 24 blocks: not all six fit at once
    assert run(crowded, prompts) == alone
    assert crowded.stats()["preemptions"] > 0 and crowded.stats()["kv_blocks_free"] == 24


def test_n_samples_differ_and_abort_ends_every_sample():
    sim = engine()
    out = run(sim, {"n": (list(range(30, 50)), SamplingParams(temperature=1.0, n=3, max_tokens=10, ignore_eos=True))})
    assert sorted(index for _, index in out) == [0, 1, 2] and len({tuple(t) for t in out.values()}) == 3
    sim.add_request("x", list(range(30, 50)), greedy(100))
    sim.step()
    assert sim.abort_request("x") and not sim.has_unfinished_requests() and not sim.abort_request("x")


def test_what_the_sim_cannot_serve_is_refused_clearly():
    sim = engine()
    with pytest.raises(RequestError, match="structured outputs are not simulated"):
        sim.check_grammar(SamplingParams(grammar={"type": "regex", "regex": "a+"}))
    with pytest.raises(RequestError, match="out of range") as bad:
        sim.add_request("v", [sim.vocab_size + 5], greedy())
    assert bad.value.param == "prompt"
    with pytest.raises(RequestError, match="context is"):
        sim.add_request("long", [7] * sim.max_model_len, greedy())


def test_step_times_follow_the_profile_within_ten_percent():
    """Each step sleeps until the profile's time for what it computed: the run's measured time
    over the modelled one (both taken by the engine) stays within 10%."""
    # Steps of 10-40 ms: a late wake-up of a millisecond on a busy machine is within the 10%.
    profile = SimProfile(0.02, 5e-5, 0.01, 2e-4, 1e-6, kv_bytes_per_token=2048)
    sim = engine(profile)
    run(sim, {f"r{i}": (list(range(10, 10 + 30 * (i + 1))), greedy(12)) for i in range(5)})
    assert sim.timing.steps > 10
    assert 1.0 <= sim.timing.measured / sim.timing.modelled < 1.1, sim.timing


def test_profiles_load_by_name_and_refuse_what_they_cannot_use(tmp_path):
    assert {"cpu-demo", "h100-llama3-8b"} <= set(shipped_profiles())
    h100 = load_profile("h100-llama3-8b")
    assert h100.step_seconds(0, 1, 0) > 0.005 and "published" in h100.source
    assert load_profile("cpu-demo").kv_bytes_per_token == 2 * 4 * 2 * 32 * 4  # K and V, 4 layers, fp32
    with pytest.raises(ProfileError, match="no simulation profile 'nope'"):
        load_profile("nope")
    with pytest.raises(ProfileError, match="missing"):
        SimProfile.from_dict({"prefill_base": 0.1})
    with pytest.raises(ProfileError, match="must be a number >= 0"):
        SimProfile.from_dict({**h100.to_dict(), "decode_base": -1})
    assert SimProfile.from_dict(h100.to_dict()) == h100


def test_the_sim_replica_loads_neither_torch_nor_the_model_code():
    code = (
        "import sys, workers.replica.server, workers.sim.engine, workers.replica.__main__\n"
        "assert not {'torch', 'transformers', 'triton'} & set(sys.modules), 'torch loaded'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
