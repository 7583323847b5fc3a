"""The model architectures Switchyard serves, in one torch-free table: the catalog and the
gateway read it to accept a model, the planner to size one, the engine to build one
(workers/engine/models/ has a class for each name, checked by a test) and a parallel group to
refuse what it does not shard."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Architecture:
    name: str  # config.json's `architectures[0]`
    model_types: tuple[str, ...]  # config.json's `model_type` spellings (a text_config may give only that)
    attention: str  # "dense" (K/V heads) or "mla" (DeepSeek's latent attention, + MoE)
    parallel: bool = True  # tensor/pipeline-parallel replicas shard it (workers/engine/parallel/)


ARCHITECTURES = (
    Architecture("LlamaForCausalLM", ("llama",), "dense"),
    Architecture("MistralForCausalLM", ("mistral",), "dense"),
    Architecture("Qwen2ForCausalLM", ("qwen2",), "dense"),
    Architecture("Qwen3ForCausalLM", ("qwen3",), "dense"),
    Architecture("DeepseekV3ForCausalLM", ("deepseek_v3", "kimi_k2"), "mla"),  # DeepSeek-V3, Kimi K2
)

SUPPORTED_ARCHITECTURES = tuple(a.name for a in ARCHITECTURES)
DENSE_ARCHITECTURES = tuple(a.name for a in ARCHITECTURES if a.attention == "dense")
MLA_ARCHITECTURES = tuple(a.name for a in ARCHITECTURES if a.attention == "mla")
PARALLEL_ARCHITECTURES = tuple(a.name for a in ARCHITECTURES if a.parallel)
# A `text_config` without `architectures` names its decoder by model_type.
TEXT_MODEL_TYPES = {model_type: a.name for a in ARCHITECTURES for model_type in a.model_types}
