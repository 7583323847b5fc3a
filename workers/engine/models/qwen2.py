"""Qwen2: the Llama decoder with a bias on the q/k/v projections (`attention_bias`)."""

from workers.engine.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    pass
