"""What a step costs apart from this machine's speed: tensor ops dispatched and weight bytes read.

Timings on a small CPU say how this machine runs a step. Two counts say what any machine must
do, and so bound the speed-up of speculative decoding elsewhere too:

* ops: the aten ops a step dispatches (views, which move no data, not counted). Where every op
  costs about the same whatever its size, as on a GPU running a small model's step as one
  captured graph, time is proportional to them.
* weight bytes: the linear layers' weights a step reads (each once, whatever the rows). Where a
  step streams its weights from memory, as a large model's decode does, time is proportional
  to them.

A draft-and-verify cycle that yields L tokens on average pays one verify (the target's ops and
bytes) plus a draft run; at best it runs L / (cycle / decode step) times as fast as plain decoding.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that run no kernel on any device: views (they only re-describe a tensor), allocation, and
# no-ops (a conversion to the dtype a tensor has, detaching in inference mode). A reshape or
# flatten that had to copy is counted (COPY_IF_NEEDED).
FREE_OPS = frozenset(
    """alias as_strided chunk detach detach_ expand flatten lift_fresh narrow permute reshape
    resolve_conj resolve_neg select slice split split_with_sizes squeeze t transpose unbind
    unflatten unsqueeze view view_as_complex view_as_real _reshape_alias _unsafe_view empty empty_like
    empty_strided""".split()  # noqa: SIM905
)
COPY_IF_NEEDED = frozenset({"reshape", "flatten"})


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched inside it that run a kernel (FREE_OPS left out, unless a
    reshape copied; `to` when it returns its input). Meant for inference mode, as the engine
    runs: there composite ops such as matmul and rms_norm arrive whole, one kernel each on a GPU."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if name in COPY_IF_NEEDED:
            copied = result.untyped_storage().data_ptr() != args[0].untyped_storage().data_ptr()
            self.ops += copied
        elif name not in FREE_OPS and not (name == "to" and result is args[0]):
            self.ops += 1
        return result


@contextmanager
def counting(target, name: str, counts: list[int]):
    """While inside, each call of `target.name` appends the ops it dispatched to `counts`
    (the attribute is wrapped on the instance and restored after)."""
    own = name in vars(target)  # already wrapped on the instance (the bench's timers)
    inner: Callable = getattr(target, name)

    def counted(*args, **kwargs):
        with OpCounter() as counter:
            result = inner(*args, **kwargs)
        counts.append(counter.ops)
        return result

    setattr(target, name, counted)
    try:
        yield
    finally:
        if own:
            setattr(target, name, inner)
        else:
            delattr(target, name)


def linear_bytes(*modules: nn.Module) -> int:
    """Bytes of the 2-D weights of the `nn.Linear` layers in `modules` (a tied LM head once;
    quantized layers, which are not nn.Linear, are not counted)."""
    seen: set[int] = set()
    total = 0
    for module in modules:
        for sub in module.modules():
            weight = getattr(sub, "weight", None)
            if isinstance(sub, nn.Linear) and isinstance(weight, torch.Tensor) and id(weight) not in seen:
                seen.add(id(weight))
                total += weight.numel() * weight.element_size()
    return total


def eagle3_observe_bytes(head) -> int:
    """Weight bytes of an EAGLE-3 head's `observe` pass (speculative/eagle3.py): fc, then its layer."""
    return linear_bytes(head.fc, head.qkv_proj, head.o_proj, head.gate_up_proj, head.down_proj)


def eagle3_cycle_bytes(head, k: int) -> int:
    """Weight bytes an EAGLE-3 head reads per draft run of k tokens: the observe pass over the
    step's kept rows, the LM head for each of the k guesses, and the layer again for each guess
    after the first."""
    layer = linear_bytes(head.qkv_proj, head.o_proj, head.gate_up_proj, head.down_proj)
    return eagle3_observe_bytes(head) + k * linear_bytes(head.lm_head) + (k - 1) * layer
