"""Discover this machine's accelerators: CUDA devices through torch when present, otherwise
one `cpu` device whose memory is the configured budget."""

from __future__ import annotations

import logging
import platform

import psutil

log = logging.getLogger(__name__)


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


def _cuda_devices() -> list[dict]:
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        free, total = torch.cuda.mem_get_info(i)
        try:
            util = float(torch.cuda.utilization(i))
        except Exception:  # NVML missing: utilisation unknown, device still usable
            util = 0.0
        out.append(
            {
                "index": i,
                "kind": "cuda",
                "name": props.name,
                "memory_total": total,
                "memory_used": total - free,
                "utilization": util,
                "health": "healthy",
            }
        )
    return out


def stats(devices: list[dict]) -> list[dict]:
    """Fresh utilisation/memory figures for the heartbeat."""
    if devices and devices[0]["kind"] == "cpu":  # the CPU devices share one machine's figures
        utilization, used = psutil.cpu_percent(interval=None), psutil.virtual_memory().used
        return [{**d, "utilization": utilization, "memory_used": min(used, d["memory_total"])} for d in devices]
    return _cuda_devices() or devices
