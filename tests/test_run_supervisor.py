"""`make run`'s supervisor (scripts/run.py) on real processes: a process that dies is restarted
with a doubling, capped delay (from the first again once it ran long enough), stop() ends every
process (SIGKILL for one that ignores SIGTERM) and restarts nothing after, the processes die with
make run however it dies, and replicas the node agent left running are stopped."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from scripts.run import ROOT, Supervisor, stop_stray_replicas
from tests.support.stack import pid_alive, wait_for

PY = sys.executable


def _ticking(sup: Supervisor, until, timeout: float, what: str):
    def step():
        sup.tick()
        return until()

    return wait_for(step, timeout, what, interval=0.01)


def test_a_process_that_keeps_dying_is_restarted_with_a_doubling_capped_delay(tmp_path):
    said: list[str] = []
    sup = Supervisor(say=said.append, first_delay=0.05, max_delay=0.2, stable_after=30)
    log = tmp_path / "flaky.log"
    service = sup.start("flaky", [PY, "-c", "print('up', flush=True); raise SystemExit(3)"], log)
    _ticking(sup, lambda: len(said) >= 5, 30, "five restarts")
    sup.stop()

    assert said[0] == f"flaky exited with code 3; restarting in 0.05s (log: {log})"
    delays = [float(re.search(r"restarting in ([\d.]+)s", m).group(1)) for m in said[:5]]
    assert delays == [0.05, 0.1, 0.2, 0.2, 0.2]
    assert all("keeps dying within 30s of starting" in m for m in said[2:5])
    assert service.restarts >= 4
    text = log.read_text()
    assert text.count("up\n") >= 5  # really started again each time
    assert "] flaky exited with code 3; restarting in 0.2s (it keeps dying" in text  # the log says so too


def test_a_process_that_ran_long_enough_is_restarted_after_the_first_delay_again(tmp_path):
    said: list[str] = []
    sup = Supervisor(say=said.append, first_delay=0.05, max_delay=0.2, stable_after=0.3)
    sup.start("slow", [PY, "-c", "import time; time.sleep(0.6); raise SystemExit(1)"], tmp_path / "slow.log")
    _ticking(sup, lambda: len(said) >= 3, 30, "three restarts")
    sup.stop()
    assert all("restarting in 0.05s" in m for m in said[:3]), said


def test_stop_ends_every_process_and_nothing_restarts_after(tmp_path):
    sup = Supervisor(say=lambda m: None, first_delay=0.01)
    stubborn_log = tmp_path / "stubborn.log"
    stubborn = sup.start("stubborn", [PY, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                      "print('ready', flush=True); time.sleep(120)"], stubborn_log)  # fmt: skip
    polite = sup.start("polite", [PY, "-c", "import time; time.sleep(120)"], tmp_path / "polite.log")
    wait_for(lambda: "ready" in stubborn_log.read_text(), 30, "the SIGTERM handler to be installed")

    sup.stop(("polite",), timeout=5)
    assert stubborn.proc.poll() is None  # not named: still running
    sup.stop(timeout=0.5)
    assert polite.proc.returncode == -signal.SIGTERM
    assert stubborn.proc.returncode == -signal.SIGKILL
    sup.tick()
    assert sup.alive("polite") is None and sup.alive("stubborn") is None
    assert stubborn.restarts == polite.restarts == 0


def test_the_processes_die_with_make_run_even_when_it_is_killed(tmp_path):
    """A SIGKILLed make run cannot stop anything itself: its children get SIGTERM from the kernel."""
    parent = subprocess.Popen(
        [PY, "-c", "import sys, time; from pathlib import Path; from scripts.run import Supervisor; "
                   "s = Supervisor().start('child', [sys.executable, '-c', 'import time; time.sleep(120)'], "
                   f"Path({str(tmp_path / 'child.log')!r})); print(s.proc.pid, flush=True); time.sleep(120)"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        child = int(parent.stdout.readline())
        assert pid_alive(child)
        parent.kill()
        parent.wait(timeout=10)
        wait_for(lambda: not pid_alive(child), 10, "the child to end with its parent")
    finally:
        parent.kill()
        parent.wait(timeout=10)
        parent.stdout.close()


def test_replicas_the_agent_left_are_stopped_and_nothing_else(tmp_path):
    """A replica whose pid file outlived the agent is stopped; a pid file naming some other
    process (its pid reused) stops nothing."""
    sleep = [PY, "-c", "import time; time.sleep(120)"]
    replica = subprocess.Popen(sleep, env={**os.environ, "SWITCHYARD_REPLICA_ID": "5"}, start_new_session=True)
    other = subprocess.Popen(sleep, env={**os.environ, "SWITCHYARD_REPLICA_ID": "9"})
    try:
        (tmp_path / "replica-5.pid").write_text(f"{replica.pid} 0")
        (tmp_path / "replica-6.pid").write_text(f"{other.pid} 0")
        wait_for(lambda: b"SWITCHYARD_REPLICA_ID=5" in Path(f"/proc/{replica.pid}/environ").read_bytes(), 10, "exec")
        assert stop_stray_replicas(tmp_path, timeout=10) == [replica.pid]
        replica.wait(timeout=10)  # ended (psutil reaped it, so its code reads 0 here)
        assert other.poll() is None
    finally:
        for p in (replica, other):
            p.kill()
            p.wait(timeout=10)
