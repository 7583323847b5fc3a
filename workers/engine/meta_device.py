"""Models are built on the meta device (shapes, no storage: loader.py) and then given storage and
filled from the checkpoint. On the meta device torch runs many ops as Python references whose
first call imports torch._dynamo (1.5 s of CPU) or sympy (0.4 s), once in every replica and every
parallel rank. So nothing is computed there: layers leave their weights uninitialised
(layers/embedding.py), tables are built after materialising, and storage is made here."""

from __future__ import annotations

import torch


def empty_on(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`module.to_empty(device)`, built without meta-device ops: `to_empty` calls `empty_like` on
    each meta tensor, torch's Python reference for which imports sympy (0.4 s of every replica's
    and every rank's start). Shared weights come out untied, as with `to_empty`."""
    for m in module.modules():
        for name, p in m._parameters.items():
            if p is not None:
                empty = torch.empty(p.shape, dtype=p.dtype, device=device)
                m._parameters[name] = torch.nn.Parameter(empty, requires_grad=p.requires_grad)
        for name, b in m._buffers.items():
            if b is not None:
                m._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device=device)
    return module
