"""`python -m workers.bench spec --quick --json` on the demo model: the last line is the promised
JSON, one run per (workload, batch, method), greedy outputs identical to no speculation's, and
acceptance lengths that mean something. EAGLE-3 runs once its draft head is committed; without
one, asking for it fails and says how to make it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workers.bench.processes import ROOT
from workers.bench.spec import DRAFT_DIR

pytestmark = pytest.mark.timeout(300)
KEYS = {"workload", "batch", "method", "tok_s", "speedup", "acceptance_length", "identical", "ceiling"}
HAS_DRAFT = (DRAFT_DIR / "config.json").is_file()
METHODS = ["none", "ngram", "eagle3", "auto"] if HAS_DRAFT else ["none", "ngram"]


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "workers.bench", "spec", "--quick", "--no-stack", "--json", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_quick_spec_bench_reports_every_run_with_outputs_identical_to_no_speculation():
    out = bench("--methods", ",".join(METHODS))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout  # --json: nothing but the JSON line
    report = json.loads(lines[-1])
    assert set(report) == {"runs", "stack"} and report["stack"] is None  # --no-stack
    runs = report["runs"]
    for run in runs:
        assert set(run) == KEYS
        assert run["tok_s"] > 0 and run["speedup"] > 0
        assert run["identical"] is True, run
    cells = sorted((r["workload"], r["batch"], r["method"]) for r in runs)
    assert cells == sorted((w, b, m) for w in ("tool_calls", "chat") for b in (1, 8, 32) for m in METHODS)
    for run in runs:
        if run["method"] == "none":
            assert run["speedup"] == 1.0 and run["acceptance_length"] is None and run["ceiling"] == 1.0
        else:  # L x decode / a step of k guesses each: never above k + 1 times what a verify costs over a decode
            assert run["ceiling"] is None or 0 < run["ceiling"] < 4 * 4, run
    # At batch 1 every sequence drafts k in the always-drafting engine, so each ceiling is measured.
    assert all(r["ceiling"] is not None for r in runs if r["batch"] == 1), runs
    # ngram and eagle3 always speculate at batch 1 (under disable_by_batch_size); at batch 8 a
    # method may draft nothing, and then has no acceptance length. So may `auto` anywhere: it
    # drafts where its measured step times say it pays, which on a machine shared with other
    # tests can be nowhere in a quick run (its choice is tested in test_speculation_cost_model).
    for method in METHODS[1:]:
        lengths = [r["acceptance_length"] for r in runs if r["method"] == method and r["batch"] == 1]
        if method != "auto":
            assert any(length is not None for length in lengths), (method, runs)
        assert all(length is None or 1 <= length <= 4 for length in lengths), (method, lengths)  # k = 3
    if HAS_DRAFT:  # a trained head guesses some tokens right on the corpus it was trained for
        eagle = [r["acceptance_length"] for r in runs if r["method"] == "eagle3" and r["batch"] == 1]
        assert all(length is not None and length > 1 for length in eagle), eagle


def test_eagle3_without_a_draft_head_fails_saying_how_to_make_one(tmp_path):
    out = bench("--draft", str(tmp_path / "missing"))
    assert out.returncode != 0
    assert out.stdout == ""
    assert "make demo-draft" in out.stderr and "--methods none,ngram" in out.stderr
