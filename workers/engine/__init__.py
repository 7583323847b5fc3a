"""Switchyard's inference engine: Hugging Face checkpoints, paged KV cache with prefix caching,
continuous batching. No Django, no Redis: the replica process adapts it to the control plane."""

from workers.engine.config import EngineConfig, ModelConfig
from workers.engine.errors import ModelLoadError, RequestError, UnsupportedArchitectureError
from workers.engine.llm import LLM
from workers.engine.llm_engine import LLMEngine
from workers.engine.outputs import CompletionOutput, RequestDelta, RequestOutput
from workers.engine.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "LLMEngine",
    "ModelConfig",
    "ModelLoadError",
    "RequestDelta",
    "RequestError",
    "RequestOutput",
    "SamplingParams",
    "UnsupportedArchitectureError",
]
