"""Mistral: the Llama decoder. Its sliding window is honoured by capping the context at the
window (`ModelConfig.max_context`), where full attention and windowed attention agree."""

from workers.engine.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    pass
