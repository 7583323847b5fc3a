"""A parallel group starts or fails fast: a rank that dies while the group starts fails it within
seconds, naming the rank, its exit code and why, and leaves no rank running."""

import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from tests.engine.test_parallel_group import alive, wait_gone
from workers.engine import LLM, SamplingParams
from workers.engine.parallel import ParallelError

ROOT = Path(__file__).resolve().parents[2]


def test_a_rank_killed_while_the_group_starts_fails_it_quickly(llama_dir):
    ranks: dict[str, int] = {}  # name -> pid
    killed_at = []

    def kill_rank_2_once_all_exist():
        # The group cannot finish starting before rank 2 has started Python and imported torch:
        # seen as a process, it is still starting.
        deadline = time.monotonic() + 120
        while len(ranks) < 3 and time.monotonic() < deadline:
            ranks.update({p.name: p.pid for p in mp.active_children() if p.name.startswith("rank-")})
            time.sleep(0.005)
        if "rank-2" in ranks:
            os.kill(ranks["rank-2"], signal.SIGKILL)
            killed_at.append(time.monotonic())

    killer = threading.Thread(target=kill_rank_2_once_all_exist)
    killer.start()
    try:
        with pytest.raises(ParallelError) as info:
            # A short compute timeout bounds the one moment rank 0 could not see the death at
            # once: rank 2 killed between reaching the store and connecting (launch.py).
            LLM(
                str(llama_dir),
                dtype="float32",
                num_kv_blocks=16,
                tensor_parallel_size=2,
                pipeline_parallel_size=2,
                parallel_timeout_s=10,
            )
        failed_at = time.monotonic()
    finally:
        killer.join()
    assert killed_at, f"the ranks never all started: {ranks}"
    message = str(info.value)
    assert f"rank 2 (pid {ranks['rank-2']}) exited with code -9 (SIGKILL)" in message, message
    assert failed_at - killed_at[0] < 30
    assert wait_gone(list(ranks.values())) == []


def test_a_rank_that_fails_to_load_names_itself_and_why(llama_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(llama_dir, broken)
    weights = broken / "model.safetensors"
    tensors = load_file(weights)
    # Stage 1 (rank 1) holds layer 1: its weights are gone, stage 0's are whole.
    save_file({k: v for k, v in tensors.items() if not k.startswith("model.layers.1.")}, weights)
    started = time.monotonic()
    with pytest.raises(ParallelError, match=r"rank 1 \(pid \d+\) exited with code 1: \w+") as info:
        LLM(str(broken), dtype="float32", num_kv_blocks=16, pipeline_parallel_size=2)
    assert time.monotonic() - started < 120  # spawn, import and load on a loaded machine; not a 300 s wait
    pid = int(re.search(r"rank 1 \(pid (\d+)\)", str(info.value)).group(1))
    assert not alive(pid)
    # The process can start a group again.
    with LLM(str(llama_dir), dtype="float32", num_kv_blocks=16, pipeline_parallel_size=2) as llm:
        out = llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=2, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == 2


def test_a_script_without_the_main_guard_fails_fast_and_says_so(llama_dir, tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            from workers.engine import LLM
            try:
                LLM({str(llama_dir)!r}, dtype="float32", num_kv_blocks=16, tensor_parallel_size=2)
            finally:
                # Run here and again in rank 1, which imports this script as __mp_main__.
                print(f"{{__name__}} failed at {{time.monotonic()}}", file=sys.stderr, flush=True)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    assert proc.returncode != 0
    err = proc.stderr
    failed = dict(re.findall(r"^(__\w+__) failed at ([\d.]+)$", err, re.MULTILINE))
    assert set(failed) == {"__main__", "__mp_main__"}, err
    assert float(failed["__main__"]) - float(failed["__mp_main__"]) < 30, err  # CLOCK_MONOTONIC: one clock
    error = err.strip().splitlines()[-1]  # the parent's: raised from LLM() once rank 1 exited
    pid = int(re.match(r"\S*ParallelError: the parallel group did not start: rank 1 \(pid (\d+)\)", error).group(1))
    assert (
        'exited with code 1: the script that makes the LLM does so when imported, outside `if __name__ == "__main__":`'
        in error
    )
    assert not alive(pid)


def test_a_second_group_in_one_process_says_how_to_close_the_first(llama_dir):
    llm = LLM(str(llama_dir), dtype="float32", num_kv_blocks=16, tensor_parallel_size=2)
    engine = llm.engine
    del llm  # does not stop the ranks
    try:
        with pytest.raises(ParallelError) as info:
            LLM(str(llama_dir), dtype="float32", num_kv_blocks=16, tensor_parallel_size=2)
        assert "`llm.close()`" in str(info.value)
        assert "`with LLM(...) as llm:`" in str(info.value)
    finally:
        engine.close()
