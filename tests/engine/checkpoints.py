"""Tiny random Hugging Face checkpoints and a byte-level BPE tokenizer, made offline for tests.

transformers is the oracle: each checkpoint is created by its `*ForCausalLM(config)` and saved
with `save_pretrained`, exactly as a real model directory would be.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% if tools %}<|system|>Tools: {{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Switchyard serves large language models on a fleet of machines.",
    "Prefill is compute bound; decode is memory bound.",
    "Unicode: naïve café, 東京, emoji 🚀🙂 and more ✓.",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
] * 20


def build_tokenizer(directory: Path, vocab_size: int = 320) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "chat_template": CHAT_TEMPLATE,
            }
        )
    )


ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama3_rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
    ),
    "llama_tied": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": True}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4096}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 24}),
}

# DeepseekV3ForCausalLM (MLA + MoE), tiny: a dense first layer, then routed + shared experts.
_DEEPSEEK = {
    "num_key_value_heads": 4,  # MLA: every head reads the one latent
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 16,
    "v_head_dim": 24,
    "num_hidden_layers": 3,
}
ARCHS.update(
    {
        # DeepSeek-V3's shape: q_lora_rank, group-limited routing, yarn with mscale = mscale_all_dim.
        "deepseek_v3": (
            "DeepseekV3Config",
            "DeepseekV3ForCausalLM",
            {
                **_DEEPSEEK,
                "q_lora_rank": 48,
                "n_group": 4,
                "topk_group": 2,
                "routed_scaling_factor": 2.5,
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 10000.0,
                    "factor": 4.0,
                    "original_max_position_embeddings": 256,
                    "beta_fast": 32,
                    "beta_slow": 1,
                    "mscale": 1.0,
                    "mscale_all_dim": 1.0,
                },
            },
        ),
        # Queries without the low-rank step (q_lora_rank null, as DeepSeek-V2-Lite), plain rope.
        "deepseek_v3_no_q_lora": (
            "DeepseekV3Config",
            "DeepseekV3ForCausalLM",
            {**_DEEPSEEK, "q_lora_rank": None, "n_group": 2, "topk_group": 1, "rope_interleave": False},
        ),
        # Kimi K2's shape: one group (no group limit), its scaling factor, yarn whose mscale and
        # mscale_all_dim differ (the cos/sin and the softmax are scaled).
        "kimi_k2": (
            "DeepseekV3Config",
            "DeepseekV3ForCausalLM",
            {
                **_DEEPSEEK,
                "q_lora_rank": 48,
                "n_group": 1,
                "topk_group": 1,
                "routed_scaling_factor": 2.827,
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 50000.0,
                    "factor": 8.0,
                    "original_max_position_embeddings": 128,
                    "beta_fast": 32,
                    "beta_slow": 1,
                    "mscale": 1.0,
                    "mscale_all_dim": 0.8,
                },
            },
        ),
    }
)


def build_checkpoint(
    directory: Path,
    arch: str = "llama",
    vocab_size: int = 320,
    seed: int = 0,
    max_shard_size: str | None = None,
    **overrides,
) -> Path:
    import transformers

    config_cls, model_cls, extra = ARCHS[arch]
    kwargs = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab_size,
        max_position_embeddings=1024,
        initializer_range=0.2,
        eos_token_id=0,
        bos_token_id=None,
        pad_token_id=0,
    )
    kwargs.update(extra)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**kwargs)).eval()
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # initialised to zeros: make it matter
                buffer.normal_(0.0, 0.1)
    save = {"safe_serialization": True}
    if max_shard_size:
        save["max_shard_size"] = max_shard_size
    model.save_pretrained(directory, **save)
    build_tokenizer(directory, vocab_size)
    return directory


def build_eagle3_head(
    directory: Path,
    target_dir: Path,
    draft_vocab_size: int | None = None,
    aux_layer_ids: list[int] | None = None,
    seed: int = 1,
    random_norms: bool = False,
    **overrides,
) -> Path:
    """A random-weight EAGLE-3 head for the target in `target_dir`, in the SpecForge layout
    (workers/protocol/draft_models.py). With a smaller `draft_vocab_size` the draft vocabulary
    is the first target ids (d2t all zeros, t2d true for those). Its RMSNorm weights are ones,
    or with `random_norms` random in [0.5, 1.5] (a trained head's are not ones)."""
    from safetensors.torch import save_file

    from workers.draft_training.train_eagle3 import head_config
    from workers.protocol.draft_models import Eagle3Spec, expected_shapes

    target = json.loads((target_dir / "config.json").read_text())
    vocab = target["vocab_size"]
    config = head_config(target, draft_vocab_size or vocab, aux_layer_ids)
    config.update(overrides)
    spec = Eagle3Spec.from_config(config)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in expected_shapes(spec).items():
        if name.endswith("norm.weight"):
            tensors[name] = 0.5 + torch.rand(shape, generator=generator) if random_norms else torch.ones(shape)
        elif name == "d2t":
            tensors[name] = torch.zeros(shape, dtype=torch.int64)
        else:
            tensors[name] = torch.randn(shape, generator=generator) * 0.2
    if spec.draft_vocab_size != vocab:
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[: spec.draft_vocab_size] = True
        tensors["t2d"] = t2d
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory
