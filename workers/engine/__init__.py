"""Switchyard's inference engine: Hugging Face checkpoints, paged KV cache with prefix caching,
continuous batching. No Django, no Redis: the replica process adapts it to the control plane.

The names below load on first use (PEP 562), so a process that needs one part (a parallel
rank: parallel/launch.py) does not import the sampler, grammars and the rest at start."""

import importlib

_EXPORTS = {
    "LLM": "workers.engine.llm",
    "CompletionOutput": "workers.engine.outputs",
    "EngineConfig": "workers.engine.config",
    "LLMEngine": "workers.engine.llm_engine",
    "ModelConfig": "workers.engine.config",
    "ModelLoadError": "workers.engine.errors",
    "RequestDelta": "workers.engine.outputs",
    "RequestError": "workers.engine.errors",
    "RequestOutput": "workers.engine.outputs",
    "SamplingParams": "workers.engine.sampling_params",
    "UnsupportedArchitectureError": "workers.engine.errors",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'workers.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
