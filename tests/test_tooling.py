"""What a newcomer meets first: `make check` and the README's examples."""

import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_make_check_needs_no_database():
    """`make check` runs cleanly whether or not TEST_DATABASE_URL's database exists (it used to
    warn that it did not: nothing creates it)."""
    missing = f"postgres://postgres@127.0.0.1:5432/nope_{uuid.uuid4().hex[:8]}"
    plan = subprocess.run(
        ["make", "-n", "check", f"TEST_DATABASE_URL={missing}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    commands = [line for line in plan.splitlines() if "manage.py" in line]
    assert len(commands) == 2, plan
    for command in commands:
        words = shlex.split(command)
        n = next(i for i, w in enumerate(words) if not re.fullmatch(r"[A-Z_]+=.*", w))  # VAR=value prefixes
        env = dict(w.split("=", 1) for w in words[:n])
        argv = [sys.executable, *words[n + 1 :]]  # the venv's python is this one
        done = subprocess.run(argv, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "Warning" not in done.stderr, done.stderr


def test_readme_examples_use_the_printed_url_not_a_fixed_port():
    """`make run` serves on $PORT and prints its URL; an example with a fixed port fails for anyone
    who set PORT."""
    for doc in (ROOT / "README.md", ROOT / "frontend" / "README.md", ROOT / "frontend" / "vite.config.ts"):
        assert not re.search(r"(127\.0\.0\.1|localhost):8000", doc.read_text()), doc


def test_make_test_and_make_unit_run_two_workers_unless_told_otherwise():
    def plan(target: str, *args: str) -> str:
        run = subprocess.run(["make", "-n", target, *args], cwd=ROOT, capture_output=True, text=True, check=True)
        return next(line for line in run.stdout.splitlines() if "-m pytest" in line)

    for target in ("test", "unit"):
        assert "-n 2 --dist loadscope" in plan(target)
        assert "-n 4 --dist loadscope" in plan(target, "TEST_WORKERS=4")
        assert " -n " not in plan(target, "TEST_WORKERS=1")


def test_a_pytest_worker_computes_on_one_thread():
    """Two workers on two cores, each with torch's default of a thread per core, spin against
    each other (tests/conftest.py); one process alone keeps torch's default."""
    import pytest
    import torch

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("one pytest process (TEST_WORKERS=1): torch keeps its default")
    assert os.environ["OMP_NUM_THREADS"] == "1" and torch.get_num_threads() == 1
