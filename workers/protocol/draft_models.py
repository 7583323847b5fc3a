"""EAGLE-3 draft heads on disk, read without torch: the engine loads them, the control plane
checks a draft against its target before any replica starts.

The layout is the one the public EAGLE-3 heads and the SpecForge / speculators trainers write
(and vLLM and SGLang load):

config.json
    `architectures`: ["LlamaForCausalLMEagle3"] (SpecForge) or ["Eagle3LlamaForCausalLM"];
    the decoder layer's shape in Llama's keys (`hidden_size`, `num_attention_heads`,
    `num_key_value_heads`, `head_dim`, `intermediate_size`, `rms_norm_eps`, `rope_theta` or
    `rope_parameters`, `max_position_embeddings`); `vocab_size` (the target's vocabulary);
    `draft_vocab_size` (the head's own, ≤ vocab_size; absent: the same);
    `eagle_aux_hidden_state_layer_ids` (top level or under `eagle_config`): the target layers
    whose hidden states are fused; `target_hidden_size` when the target's differs.
model.safetensors
    `fc.weight` [hidden, 3·target_hidden] fuses the three hidden states;
    `midlayer.*` the one decoder layer (q/k/v/o_proj with 2·hidden inputs to q/k/v: the token
    embedding and the fused state, side by side; mlp gate/up/down_proj; input_layernorm,
    hidden_norm, post_attention_layernorm); `norm.weight`; `lm_head.weight` [draft_vocab,
    hidden]; `d2t` [draft_vocab] int64 offsets (target id = draft id + d2t[draft id]); `t2d`
    [vocab] bool (which target ids the draft can say); `embed_tokens.weight` optional (absent:
    the target's embedding is shared).

Aux layer ids name target decoder layers by index (0-based): the hidden state taken is that
layer's output (the residual stream after it). Default, when the config names none: the low,
middle and high layers (1, L//2 − 1, L − 4: SpecForge's choice for Llama), or for a model of
fewer than 8 layers its first, middle and last (our trainer writes the ids it used).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from workers.protocol.model_files import ModelDirectoryError, read_config, weight_files

EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
NUM_AUX_LAYERS = 3


def safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file: tensor name → {dtype, shape, data_offsets}."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ModelDirectoryError(f"{path.name} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", raw)
        if length > 100 << 20:
            raise ModelDirectoryError(f"{path.name} has an implausible header; the file is corrupt")
        try:
            header = json.loads(f.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelDirectoryError(f"{path.name} has an unreadable header ({exc})") from exc
    if not isinstance(header, dict):
        raise ModelDirectoryError(f"{path.name} has an unreadable header (not a JSON object)")
    header.pop("__metadata__", None)
    return header


def is_eagle3(config: dict) -> bool:
    archs = config.get("architectures") or []
    return bool(archs) and archs[0] in EAGLE3_ARCHITECTURES


def default_aux_layer_ids(num_layers: int) -> tuple[int, ...]:
    if num_layers >= 8:
        return (1, num_layers // 2 - 1, num_layers - 4)
    return (0, (num_layers - 1) // 2, num_layers - 1)  # a shallow model: first, middle, last


@dataclass(frozen=True)
class Eagle3Spec:
    """What an EAGLE-3 head's config says, checked for being whole."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    # None: the config names none, the default for the target's depth applies (aux_layers()).
    aux_layer_ids: tuple[int, ...] | None

    def aux_layers(self, target_num_layers: int) -> tuple[int, ...]:
        return self.aux_layer_ids if self.aux_layer_ids is not None else default_aux_layer_ids(target_num_layers)

    @classmethod
    def from_config(cls, config: dict, source: str = "config.json") -> Eagle3Spec:
        if not is_eagle3(config):
            archs = config.get("architectures") or ["(none)"]
            raise ModelDirectoryError(
                f"{source}: architecture {archs[0]!r} is not an EAGLE-3 head; expected one of "
                f"{', '.join(EAGLE3_ARCHITECTURES)}"
            )

        def integer(key: str, default=None) -> int:
            value = config.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelDirectoryError(f"{source}: {key} must be a positive integer, got {value!r}")
            return value

        hidden = integer("hidden_size")
        heads = integer("num_attention_heads")
        eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
        ids = config.get("eagle_aux_hidden_state_layer_ids", eagle.get("eagle_aux_hidden_state_layer_ids"))
        if ids is not None:
            if (
                not isinstance(ids, list)
                or len(ids) != NUM_AUX_LAYERS
                or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
            ):
                raise ModelDirectoryError(
                    f"{source}: eagle_aux_hidden_state_layer_ids must be {NUM_AUX_LAYERS} layer indices, got {ids!r}"
                )
            ids = tuple(ids)
        rope = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}
        vocab = integer("vocab_size")
        spec = cls(
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=integer("num_key_value_heads", heads),
            head_dim=integer("head_dim", hidden // heads),
            intermediate_size=integer("intermediate_size"),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(config.get("rope_theta", rope.get("rope_theta", 10000.0))),
            max_position_embeddings=integer("max_position_embeddings", 2048),
            vocab_size=vocab,
            draft_vocab_size=integer("draft_vocab_size", vocab),
            target_hidden_size=integer("target_hidden_size", hidden),
            aux_layer_ids=ids,
        )
        if spec.draft_vocab_size > spec.vocab_size:
            raise ModelDirectoryError(
                f"{source}: draft_vocab_size {spec.draft_vocab_size} is larger than vocab_size {spec.vocab_size}"
            )
        return spec


def expected_shapes(spec: Eagle3Spec) -> dict[str, list[int]]:
    """The tensors a head must hold, with their shapes (embed_tokens, d2t and t2d are optional:
    d2t and t2d are required only when the draft vocabulary is smaller)."""
    h, hd = spec.hidden_size, spec.head_dim
    shapes = {
        "fc.weight": [h, NUM_AUX_LAYERS * spec.target_hidden_size],
        "midlayer.self_attn.q_proj.weight": [spec.num_heads * hd, 2 * h],
        "midlayer.self_attn.k_proj.weight": [spec.num_kv_heads * hd, 2 * h],
        "midlayer.self_attn.v_proj.weight": [spec.num_kv_heads * hd, 2 * h],
        "midlayer.self_attn.o_proj.weight": [h, spec.num_heads * hd],
        "midlayer.mlp.gate_proj.weight": [spec.intermediate_size, h],
        "midlayer.mlp.up_proj.weight": [spec.intermediate_size, h],
        "midlayer.mlp.down_proj.weight": [h, spec.intermediate_size],
        "midlayer.input_layernorm.weight": [h],
        "midlayer.hidden_norm.weight": [h],
        "midlayer.post_attention_layernorm.weight": [h],
        "norm.weight": [h],
        "lm_head.weight": [spec.draft_vocab_size, h],
    }
    if spec.draft_vocab_size != spec.vocab_size:
        shapes["d2t"] = [spec.draft_vocab_size]
    return shapes


def read_eagle3(model_dir: str | Path) -> Eagle3Spec:
    """The head's config, with its weight files checked against it (names and shapes)."""
    root = Path(model_dir)
    if not root.is_dir():
        raise ModelDirectoryError(f"{root} is not a directory on this machine")
    spec = Eagle3Spec.from_config(read_config(root), f"{root}/config.json")
    header: dict = {}
    for path in weight_files(root):
        header.update(safetensors_header(path))
    problems = []
    for name, shape in expected_shapes(spec).items():
        meta = header.get(name)
        if meta is None:
            problems.append(f"{name} is missing")
        elif list(meta.get("shape", [])) != shape:
            problems.append(f"{name} has shape {meta.get('shape')}, the config implies {shape}")
    if problems:
        raise ModelDirectoryError(f"{root}: not an EAGLE-3 head its config describes: {'; '.join(problems)}")
    return spec


def draft_fit_problems(spec: Eagle3Spec, target_config: dict) -> list[str]:
    """Why the head cannot draft for the target (empty: it fits). Vocabulary, hidden size and
    the aux layer ids are what the head was trained against; anything else differing is fine."""
    problems = []
    target_vocab = target_config.get("vocab_size")
    if spec.vocab_size != target_vocab:
        problems.append(f"the draft's vocab_size is {spec.vocab_size}, the target's {target_vocab}")
    target_hidden = target_config.get("hidden_size")
    if spec.target_hidden_size != target_hidden:
        problems.append(
            f"the draft fuses hidden states of size {spec.target_hidden_size}, the target's are {target_hidden}"
        )
    layers = target_config.get("num_hidden_layers")
    if isinstance(layers, int):
        bad = [i for i in spec.aux_layers(layers) if not 0 <= i < layers]
        if bad:
            problems.append(f"aux hidden state layers {bad} are not layers of the target (it has {layers})")
    return problems


def check_draft_dir(draft_dir: str | Path, target_dir: str | Path) -> Eagle3Spec:
    """The head's spec if it is whole and fits the target; ModelDirectoryError saying why not."""
    spec = read_eagle3(draft_dir)
    problems = draft_fit_problems(spec, read_config(target_dir))
    if problems:
        raise ModelDirectoryError(f"draft {draft_dir} does not fit target {target_dir}: {'; '.join(problems)}")
    return spec


__all__ = [
    "EAGLE3_ARCHITECTURES",
    "Eagle3Spec",
    "check_draft_dir",
    "default_aux_layer_ids",
    "draft_fit_problems",
    "expected_shapes",
    "is_eagle3",
    "read_eagle3",
    "safetensors_header",
]
