"""`python -m workers.bench cache --quick --json` end to end (make run, four replicas, the quick
trace) on two policies: the last line is the promised JSON, both runs replay the same trace, and
session affinity reuses more of it than round robin."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workers.bench.processes import ROOT

pytestmark = pytest.mark.timeout(300)
KEYS = {"hit_rate", "ideal_hit_rate", "ttft_p50_ms", "ttft_p90_ms", "tok_s", "imbalance"}


def test_quick_cache_bench_reports_session_affinity_above_round_robin():
    out = subprocess.run(
        [sys.executable, "-m", "workers.bench", "cache", "--quick", "--json", "--policies", "round_robin,session"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout  # --json: nothing but the JSON line
    policies = json.loads(lines[-1])["policies"]
    assert set(policies) == {"round_robin", "session"}
    for row in policies.values():
        assert set(row) == KEYS
    rr, session = policies["round_robin"], policies["session"]
    assert rr["ideal_hit_rate"] == session["ideal_hit_rate"]
    assert 0 < rr["ideal_hit_rate"] <= 1
    assert session["hit_rate"] > rr["hit_rate"]
