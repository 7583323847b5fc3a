"""Train an EAGLE-3 draft head for a target model:

    python -m workers.draft_training.train_eagle3 --target DIR --data FILE --out DIR [--steps N] [--ttt 3]

1. Responses: every prompt in FILE is answered by the target itself through the engine
   (greedy), so the head learns what the target says, not what a dataset says. FILE is JSON
   lines, each {"messages": [...], "tools": [...]} (rendered with the target's chat template),
   {"prompt": "text"} or {"prompt_token_ids": [...]}.
2. Features: each training batch runs the target (Hugging Face transformers, frozen) over
   prompt + response and keeps the outputs of its three aux layers (low, middle, high).
3. Training-time test (EAGLE-3, section 3.3): the head is unrolled `--ttt` steps. Step 1 reads
   the target's fused state at every position t with the token at t+1 and predicts t+2; step j
   reads its own step j-1 output at t with the token at t+j and predicts t+j+1, attending to
   step 1's entries up to t and to its own earlier steps' entries at t, exactly the context it
   has when drafting (workers/engine/speculative/eagle3.py). The loss is cross-entropy on the
   response's tokens, step j weighted 0.8^(j-1).
4. The draft vocabulary is the `--draft-vocab` tokens the responses use most (d2t / t2d map
   it); the LM head starts from the target's rows for them, the embedding is the target's
   (frozen, not saved). The output directory is the public EAGLE-3 layout vLLM and SGLang load.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from workers.protocol.draft_models import Eagle3Spec, default_aux_layer_ids
from workers.protocol.model_files import ModelDirectoryError, read_config

STEP_WEIGHT = 0.8  # step j of the unroll weighs 0.8^(j-1), as in EAGLE-3


def read_prompts(path: Path, tokenizer) -> list[list[int]]:
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if "prompt_token_ids" not in row and tokenizer is None:
                raise SystemExit(f"{path}:{number}: the target has no tokenizer.json; give prompt_token_ids")
            if "prompt_token_ids" in row:
                ids = [int(t) for t in row["prompt_token_ids"]]
            elif "messages" in row:
                ids = tokenizer.apply_chat_template(row["messages"], tools=row.get("tools"))
            else:
                ids = tokenizer.encode(row["prompt"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"{path}:{number}: not a prompt ({exc}); see --help for the format") from exc
        if ids:
            prompts.append(ids)
    if not prompts:
        raise SystemExit(f"{path} holds no prompts")
    return prompts


def generate_responses(target: Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """The target's greedy answers, by the engine (the tokens it will verify drafts against)."""
    from workers.engine import LLM, SamplingParams

    llm = LLM(str(target), device="cpu", dtype="float32", max_num_seqs=64, enable_prefix_caching=True)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [list(o.outputs[0].token_ids) for o in outputs]


class TargetFeatures:
    """The frozen target (transformers) with hooks keeping its aux layers' outputs."""

    def __init__(self, target: Path, layer_ids: tuple[int, ...]):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
        self.layer_ids = layer_ids
        self._kept: dict[int, torch.Tensor] = {}
        for i in set(layer_ids):
            self.model.model.layers[i].register_forward_hook(self._keeper(i))

    def _keeper(self, i: int):
        def hook(module, args, output):
            self._kept[i] = output[0] if isinstance(output, tuple) else output

        return hook

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        self.model.model(input_ids=ids, attention_mask=attention_mask)
        return torch.cat([self._kept[i] for i in self.layer_ids], dim=-1)


def draft_vocabulary(responses: list[list[int]], vocab_size: int, size: int) -> torch.Tensor:
    """The `size` target ids the responses use most, ascending (the draft id order)."""
    counts = Counter(t for r in responses for t in r)
    chosen = [t for t, _ in counts.most_common(size)]
    rest = (t for t in range(vocab_size) if t not in counts)
    while len(chosen) < size:  # fewer distinct tokens than asked: fill with unused ids
        chosen.append(next(rest))
    return torch.tensor(sorted(chosen))


def head_config(target_cfg: dict, draft_vocab: int, layer_ids: tuple[int, ...] | None) -> dict:
    """The config.json of a head shaped like one of the target's layers (layer ids None: none
    written, so a loader takes the default for the target's depth)."""
    heads = target_cfg["num_attention_heads"]
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": target_cfg["hidden_size"],
        "target_hidden_size": target_cfg["hidden_size"],
        "num_attention_heads": heads,
        "num_key_value_heads": target_cfg.get("num_key_value_heads", heads),
        "head_dim": target_cfg.get("head_dim") or target_cfg["hidden_size"] // heads,
        "intermediate_size": target_cfg["intermediate_size"],
        "rms_norm_eps": target_cfg.get("rms_norm_eps", 1e-6),
        "max_position_embeddings": target_cfg.get("max_position_embeddings", 2048),
        "num_hidden_layers": 1,
        "vocab_size": target_cfg["vocab_size"],
        "draft_vocab_size": draft_vocab,
        "torch_dtype": "float32",
    }
    if layer_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True}
    for key in ("rope_theta", "rope_parameters", "rope_scaling"):
        if key in target_cfg:
            config[key] = target_cfg[key]
    return config


def unroll(head, aux: torch.Tensor, ids: torch.Tensor, ttt: int) -> list[torch.Tensor]:
    """The head unrolled `ttt` steps over a padded batch, as it drafts: logits [B, L, draft
    vocab] of each step j, entry t predicting the token at t+j+1.

    aux [B, L, 3·target_hidden] the target's aux-layer states, ids [B, L] the tokens. Step 1
    reads the fused target state at t and the token at t+1; step j the step j-1 output at t
    and the token at t+j, attending to step 1's entries up to t and to steps 2..j's at t."""
    b, length = ids.shape
    spec = head.spec
    nh, kvh, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
    group = nh // kvh
    t = torch.arange(length)
    causal = t[None, :] <= t[:, None]  # [query, key]
    state = head.fuse(aux).reshape(b * length, -1)
    keys, values, logits = [], [], []
    for j in range(1, ttt + 1):
        tokens = ids[:, (t + j).clamp(max=length - 1)].reshape(-1)
        positions = (t + j - 1).clamp(max=spec.max_position_embeddings - 1).repeat(b)
        q, k, v, residual = head.attention_inputs(tokens, state, positions)
        q, k, v = (x.reshape(b, length, -1, hd) for x in (q, k, v))
        keys.append(k.repeat_interleave(group, dim=2))
        values.append(v.repeat_interleave(group, dim=2))
        scores = [torch.einsum("blhd,bmhd->bhlm", q, keys[0]).masked_fill(~causal, float("-inf"))]
        scores += [torch.einsum("blhd,blhd->bhl", q, key)[..., None] for key in keys[1:]]
        probs = torch.softmax(torch.cat(scores, dim=-1) * hd**-0.5, dim=-1)
        out = torch.einsum("bhlm,bmhd->blhd", probs[..., :length], values[0])
        for i, value in enumerate(values[1:]):
            out = out + probs[..., length + i].transpose(1, 2)[..., None] * value
        state = head.finish(out.reshape(b * length, nh, hd), residual)
        logits.append(head.logits(state).reshape(b, length, -1))
    return logits


def unrolled_loss(head, aux, ids, lengths, prompt_lengths, ttt: int, target_to_draft: torch.Tensor):
    """The training-time-test loss of one padded batch and each step's accuracy: cross-entropy
    of every step's prediction of a response token (in the draft vocabulary)."""
    length = ids.shape[1]
    t = torch.arange(length)
    total, accuracies = 0.0, []
    for j, logits in enumerate(unroll(head, aux, ids, ttt), 1):
        want_at = t + j + 1
        valid = (want_at[None, :] < lengths[:, None]) & (want_at[None, :] >= prompt_lengths[:, None])
        want = target_to_draft[ids[:, want_at.clamp(max=length - 1)]]
        valid &= want >= 0
        if valid.any():
            total = total + STEP_WEIGHT ** (j - 1) * F.cross_entropy(logits[valid], want[valid])
            accuracies.append(float((logits[valid].argmax(-1) == want[valid]).float().mean()))
        else:
            accuracies.append(float("nan"))
    return total, accuracies


def save_head(head, config: dict, vocab: torch.Tensor, out: Path) -> None:
    spec = head.spec
    hd = spec.head_dim
    q, k, v = head.qkv_proj.weight.detach().split((spec.num_heads * hd, spec.num_kv_heads * hd, spec.num_kv_heads * hd))
    gate, up = head.gate_up_proj.weight.detach().split(spec.intermediate_size)
    t2d = torch.zeros(spec.vocab_size, dtype=torch.bool)
    t2d[vocab] = True
    tensors = {
        "fc.weight": head.fc.weight,
        "midlayer.input_layernorm.weight": head.input_layernorm.weight,
        "midlayer.hidden_norm.weight": head.hidden_norm.weight,
        "midlayer.self_attn.q_proj.weight": q,
        "midlayer.self_attn.k_proj.weight": k,
        "midlayer.self_attn.v_proj.weight": v,
        "midlayer.self_attn.o_proj.weight": head.o_proj.weight,
        "midlayer.post_attention_layernorm.weight": head.post_attention_layernorm.weight,
        "midlayer.mlp.gate_proj.weight": gate,
        "midlayer.mlp.up_proj.weight": up,
        "midlayer.mlp.down_proj.weight": head.down_proj.weight,
        "norm.weight": head.norm.weight,
        "lm_head.weight": head.lm_head.weight,
        "d2t": vocab - torch.arange(len(vocab)),
        "t2d": t2d,
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file({name: t.detach().contiguous() for name, t in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workers.draft_training.train_eagle3", description=__doc__.split("\n\n")[0].strip()
    )
    parser.add_argument("--target", type=Path, required=True, help="the target model's directory")
    parser.add_argument("--data", type=Path, required=True, help="JSON lines of prompts (see the module docstring)")
    parser.add_argument("--out", type=Path, required=True, help="where to write the head")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--ttt", type=int, default=3, help="unrolled draft steps in training (k of drafting)")
    parser.add_argument("--draft-vocab", type=int, default=32000, help="draft vocabulary size (capped at the target's)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="longest response generated per prompt")
    parser.add_argument("--max-prompts", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from workers.engine.config import rope_from
    from workers.engine.speculative.eagle3 import Eagle3Head
    from workers.protocol.tokenizer import Tokenizer

    started = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:5.0f}s] {message}", flush=True)

    try:
        target_cfg = read_config(args.target)
        tokenizer = Tokenizer(args.target) if (args.target / "tokenizer.json").is_file() else None
    except ModelDirectoryError as exc:
        parser.error(str(exc))
    if not args.data.is_file():
        parser.error(f"--data {args.data}: no such file")
    torch.manual_seed(args.seed)
    prompts = read_prompts(args.data, tokenizer)[: args.max_prompts]
    say(f"{len(prompts)} prompts; the target answers them (greedy, at most {args.max_new_tokens} tokens)")
    responses = generate_responses(args.target, prompts, args.max_new_tokens)
    n_tokens = sum(map(len, responses))
    say(f"responses: {n_tokens} tokens, {n_tokens / max(len(responses), 1):.1f} a prompt")

    layer_ids = default_aux_layer_ids(target_cfg["num_hidden_layers"])
    vocab = draft_vocabulary(responses, target_cfg["vocab_size"], min(args.draft_vocab, target_cfg["vocab_size"]))
    config = head_config(target_cfg, len(vocab), layer_ids)
    features = TargetFeatures(args.target, layer_ids)
    head = Eagle3Head(Eagle3Spec.from_config(config), rope_from(config), features.model.get_input_embeddings())
    head.embed_tokens.weight.requires_grad_(False)
    with torch.no_grad():  # the LM head starts as the target's own, restricted to the draft vocabulary
        head.lm_head.weight.copy_(features.model.get_output_embeddings().weight[vocab])
    target_to_draft = torch.full((target_cfg["vocab_size"],), -1, dtype=torch.long)
    target_to_draft[vocab] = torch.arange(len(vocab))
    trainable = [p for p in head.parameters() if p.requires_grad]
    say(
        f"head: {sum(p.numel() for p in trainable) / 1e6:.2f}M trainable parameters, draft vocabulary {len(vocab)}, "
        f"aux layers {list(layer_ids)}, unrolled {args.ttt} steps"
    )

    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    opt = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    warmup = max(args.steps // 20, 1)
    pad = 0
    for step in range(1, args.steps + 1):
        lr = args.lr * min(step / warmup, 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.randint(len(seqs), (args.batch,), generator=gen).tolist()
        width = max(len(seqs[i]) for i in idx)
        ids = torch.full((args.batch, width), pad)
        mask = torch.zeros((args.batch, width), dtype=torch.long)
        for row, i in enumerate(idx):
            ids[row, : len(seqs[i])] = torch.tensor(seqs[i])
            mask[row, : len(seqs[i])] = 1
        lengths = mask.sum(1)
        prompt_lengths = torch.tensor([len(prompts[i]) for i in idx])
        aux = features(ids, mask)
        loss, accuracies = unrolled_loss(head, aux, ids, lengths, prompt_lengths, args.ttt, target_to_draft)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        if step % 50 == 0 or step == 1 or step == args.steps:
            acc = " ".join(f"{a:.2f}" for a in accuracies)
            say(f"step {step}/{args.steps} loss {loss.item():.4f} lr {lr:.1e} accuracy by step {acc}")

    tmp = args.out.with_name(args.out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_head(head, config, vocab, tmp)
    shutil.rmtree(args.out, ignore_errors=True)
    tmp.rename(args.out)
    say(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
