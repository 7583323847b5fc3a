"""Discover this machine's accelerators: CUDA devices as `nvidia-smi` lists them when it is
installed, otherwise `cpu_devices` `cpu` devices whose memory is the configured budget.

`nvidia-smi`, not torch: importing torch took the agent 2 s of CPU at every start, and asking
torch for a device's free memory made a CUDA context on every GPU, held by the agent for its
life (hundreds of MiB of each GPU that replicas then lacked). The replicas are started with
CUDA_DEVICE_ORDER=PCI_BUS_ID, the order nvidia-smi numbers devices in (supervisor.py).
"""

from __future__ import annotations

import importlib.util
import logging
import platform
import re
import shutil
import subprocess
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

NVIDIA_SMI_QUERY = "index,name,memory.total,memory.used,utilization.gpu"
NVIDIA_SMI_TIMEOUT = 10.0
MIB = 1 << 20


def discover(cpu_memory_bytes: int, cpu_devices: int = 1) -> list[dict]:
    devices = _cuda_devices()
    if devices:
        return devices
    return [
        {
            "index": i,
            "kind": "cpu",
            "name": f"{platform.processor() or platform.machine()} ({psutil.cpu_count()} cores)",
            "memory_total": cpu_memory_bytes,
            "memory_used": 0,
            "utilization": psutil.cpu_percent(interval=None),
            "health": "healthy",
        }
        for i in range(cpu_devices)
    ]


def torch_has_cuda() -> bool:
    """Whether the installed torch is a CUDA build, read from torch/version.py without importing
    torch. A host with an NVIDIA driver but a CPU build of torch (this repository's own venv)
    must report CPU devices: its replicas could not use the GPUs. Unreadable: trust nvidia-smi."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return False
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return True
    found = re.search(r"^cuda\s*(?::[^=]*)?=\s*(.+)$", text, re.MULTILINE)
    return found is None or found.group(1).strip() != "None"


def _cuda_devices() -> list[dict]:
    """The CUDA devices nvidia-smi lists ([] without it, when it fails (said in the log), or when
    torch here is a CPU build)."""
    smi = shutil.which("nvidia-smi")
    if smi is None or not torch_has_cuda():
        return []
    try:
        done = subprocess.run(
            [smi, f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("nvidia-smi did not answer (%s): no CUDA devices reported", exc)
        return []
    if done.returncode != 0:
        log.warning("nvidia-smi failed (exit %s): %s", done.returncode, done.stderr.strip()[:200])
        return []
    out = []
    for line in done.stdout.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5 or not fields[0].isdigit():
            continue
        index, name, total, used, util = fields
        out.append(
            {
                "index": int(index),
                "kind": "cuda",
                "name": name,
                "memory_total": _number(total) * MIB,
                "memory_used": _number(used) * MIB,
                "utilization": float(_number(util)),  # "[N/A]" where NVML cannot say: 0
                "health": "healthy",
            }
        )
    return out


def _number(text: str) -> int:
    try:
        return int(float(text))
    except ValueError:
        return 0


def stats(devices: list[dict]) -> list[dict]:
    """Fresh utilisation/memory figures for the heartbeat."""
    if devices and devices[0]["kind"] == "cpu":  # the CPU devices share one machine's figures
        utilization, used = psutil.cpu_percent(interval=None), psutil.virtual_memory().used
        return [{**d, "utilization": utilization, "memory_used": min(used, d["memory_total"])} for d in devices]
    return _cuda_devices() or devices
