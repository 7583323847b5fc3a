"""The node agent finds CUDA devices with nvidia-smi, never torch (2 s of every agent's start,
and a CUDA context it would hold on every GPU). This machine has no GPU and a CPU build of torch,
so where a test needs GPUs it puts a stand-in `nvidia-smi` first on PATH that prints what the
real one prints for `--query-gpu=... --format=csv,noheader,nounits`, and says torch is a CUDA
build: the only way to cause that answer here."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from workers.agent import devices
from workers.bench.processes import ROOT

H100 = "0, NVIDIA H100 80GB HBM3, 81559, 1024, 37\n1, NVIDIA H100 80GB HBM3, 81559, 0, [N/A]\n"


def stand_in(tmp_path, body: str):
    script = tmp_path / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return tmp_path


def test_without_nvidia_smi_the_node_reports_its_cpu_devices(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    found = devices.discover(cpu_memory_bytes=8 << 30, cpu_devices=2)
    assert [(d["index"], d["kind"], d["memory_total"]) for d in found] == [(0, "cpu", 8 << 30), (1, "cpu", 8 << 30)]


def test_nvidia_smis_gpus_are_the_nodes_devices(monkeypatch, tmp_path):
    folder = stand_in(tmp_path, f"printf '{H100}'")
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(devices, "torch_has_cuda", lambda: True)
    found = devices.discover(cpu_memory_bytes=8 << 30)
    assert [(d["index"], d["kind"], d["name"]) for d in found] == [(0, "cuda", "NVIDIA H100 80GB HBM3"),
                                                                    (1, "cuda", "NVIDIA H100 80GB HBM3")]  # fmt: skip
    assert found[0]["memory_total"] == 81559 << 20 and found[0]["memory_used"] == 1024 << 20
    assert (found[0]["utilization"], found[1]["utilization"]) == (37.0, 0.0)  # [N/A] where NVML cannot say
    assert devices.stats(found) == found  # the heartbeat's figures, asked again


@pytest.mark.parametrize("body", ["echo 'NVIDIA-SMI has failed' >&2; exit 9", "echo garbage"])
def test_a_failing_nvidia_smi_leaves_the_cpu_devices(monkeypatch, tmp_path, body, caplog):
    folder = stand_in(tmp_path, body)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(devices, "torch_has_cuda", lambda: True)
    assert [d["kind"] for d in devices.discover(cpu_memory_bytes=1 << 30)] == ["cpu"]
    if "exit 9" in body:
        assert "nvidia-smi failed (exit 9): NVIDIA-SMI has failed" in caplog.text


def test_gpus_a_cpu_build_of_torch_cannot_use_are_not_offered(monkeypatch, tmp_path):
    """This venv's torch is the CPU build (torch/version.py: `cuda = None`), read without importing it."""
    assert devices.torch_has_cuda() is False
    folder = stand_in(tmp_path, f"printf '{H100}'")
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    assert [d["kind"] for d in devices.discover(cpu_memory_bytes=1 << 30)] == ["cpu"]


def test_discovering_devices_does_not_import_torch():
    code = "import sys; from workers.agent import devices; devices.discover(1 << 30); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
