"""`python -m workers.bench parallel --quick --json` runs tp=1, tp=2 and pp=2 and ends with the
JSON line the issue names, the greedy tokens identical across layouts."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(600)


def test_parallel_bench_quick_prints_its_json(tmp_path):
    env = {**os.environ, "SWITCHYARD_CACHE": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "workers.bench", "parallel", "--quick", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=580,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    runs = result["runs"]
    assert [(r["tp"], r["pp"]) for r in runs] == [(1, 1), (2, 1), (1, 2)]
    keys = {"tp", "pp", "bs1_tok_s", "bs16_tok_s", "ttft_2k_ms", "weight_bytes_per_rank", "identical"}
    assert all(set(r) == keys for r in runs)
    assert all(r["identical"] for r in runs)
    assert all(r["bs1_tok_s"] > 0 and r["bs16_tok_s"] > 0 and r["ttft_2k_ms"] > 0 for r in runs)
    # Two ranks each hold about half the weights.
    assert runs[1]["weight_bytes_per_rank"] < 0.6 * runs[0]["weight_bytes_per_rank"]
    assert runs[2]["weight_bytes_per_rank"] < 0.6 * runs[0]["weight_bytes_per_rank"]
