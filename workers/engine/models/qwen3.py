"""Qwen3: the Llama decoder with per-head RMSNorm on q and k before rotary (`qk_norm`), and an
explicit `head_dim` that need not equal hidden_size / heads."""

from workers.engine.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    pass
