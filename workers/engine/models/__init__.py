"""Model families, one file each; `model_class` maps a config's architecture to its class."""

from workers.engine.errors import UnsupportedArchitectureError
from workers.engine.models.deepseek_v3 import DeepseekV3ForCausalLM
from workers.engine.models.llama import LlamaForCausalLM
from workers.engine.models.mistral import MistralForCausalLM
from workers.engine.models.qwen2 import Qwen2ForCausalLM
from workers.engine.models.qwen3 import Qwen3ForCausalLM

REGISTRY = {
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def model_class(architecture: str):
    try:
        return REGISTRY[architecture]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"architecture {architecture!r} is not supported; supported: {', '.join(REGISTRY)}"
        ) from None
