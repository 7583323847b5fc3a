"""Train the demo model: `python -m workers.demo.train [--out DIR] [--steps N]`.

Nothing can be downloaded here, so Switchyard ships a model it trains itself: a few-million-
parameter Llama that answers short questions and calls tools with JSON, learnt from the seeded
corpus in corpus.py. The result is an ordinary Hugging Face directory (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json with the chat template,
generation_config.json) that any Llama loader reads. Deterministic for a given seed and
torch version; about 8 minutes on two idle cores (2000 steps).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path

from workers.demo.corpus import conversations, tool_schemas

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "model"
SPECIAL = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
# Tool-call tags are ordinary (non-special) added tokens: they survive decoding, so the
# gateway can parse them out of the text.
TOOL_TAGS = ["<tool_call>", "</tool_call>"]
# The demo's own tool names are whole words to the tokenizer (single_word: not inside a longer
# name such as get_weather_forecast), so whether a request's tool was offered is one token to
# look for in the prompt rather than a spelling to match piece by piece.
TOOL_NAMES = [t["function"]["name"] for t in tool_schemas()]
# The first token of an assistant turn decides what kind of turn it is (a call, an answer, "I
# need a tool"): a few tokens among thousands, and the only ones that teach the model to check
# the offered tools, so they weigh more.
DECISION_WEIGHT = 8.0
SHAPE = dict(
    hidden_size=192,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=True,
)


def build_tokenizer(texts: list[str], out: Path, vocab_size: int) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False, single_word=True) for t in TOOL_NAMES])
    tok.save(str(out / "tokenizer.json"))
    (out / "chat_template.jinja").write_text((HERE / "chat_template.jinja").read_text())
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|end|>",
        "pad_token": "<|pad|>",
        "model_max_length": SHAPE["max_position_embeddings"],
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def assistant_mask(ids: list[int], assistant_id: int, end_id: int) -> list[bool]:
    """True for the tokens the model must learn to write: each assistant turn, its end included."""
    mask, inside = [], False
    for t in ids:
        mask.append(inside)
        if t == assistant_id:
            inside = True
        elif t == end_id:
            inside = False
    return mask


def loss_weights(ids: list[int], assistant_id: int, end_id: int) -> list[float]:
    """Each token's weight in the loss: 0 outside assistant turns, DECISION_WEIGHT for a turn's
    first token, 1 for the rest."""
    mask = assistant_mask(ids, assistant_id, end_id)
    return [DECISION_WEIGHT if keep and prev == assistant_id else float(keep) for keep, prev in zip(mask, [None, *ids])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--conversations", type=int, default=20000)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from workers.protocol.tokenizer import Tokenizer, _compile_template

    torch.manual_seed(args.seed)
    started = time.monotonic()
    tmp = args.out.with_name(args.out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    chats = conversations(args.conversations, seed=args.seed)
    # The tokenizer learns from the rendered chats themselves, so the template's markup is cheap.
    template = _compile_template((HERE / "chat_template.jinja").read_text())
    build_tokenizer([template.render(messages=m, tools=t) for m, t in chats[:4000]], tmp, args.vocab)
    tokenizer = Tokenizer(tmp)
    end_id = tokenizer._tok.token_to_id("<|end|>")
    assistant_id = tokenizer._tok.token_to_id("<|assistant|>")
    pad_id = tokenizer._tok.token_to_id("<|pad|>")
    encoded = [tokenizer.apply_chat_template(m, tools=t, add_generation_prompt=False) for m, t in chats]
    max_len = max(len(e) for e in encoded)
    if max_len > SHAPE["max_position_embeddings"]:
        raise SystemExit(f"a training chat is {max_len} tokens, over the context")
    print(f"corpus: {len(encoded)} chats, {sum(map(len, encoded))} tokens, longest {max_len}", flush=True)

    cfg = LlamaConfig(
        **SHAPE,
        vocab_size=tokenizer.vocab_size,
        bos_token_id=None,
        eos_token_id=end_id,
        pad_token_id=pad_id,
        initializer_range=0.02,
    )
    model = LlamaForCausalLM(cfg)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.2f}M parameters", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    gen = torch.Generator().manual_seed(args.seed)
    warmup = max(args.steps // 20, 1)
    model.train()
    for step in range(1, args.steps + 1):
        lr = args.lr * min(step / warmup, 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.randint(len(encoded), (args.batch,), generator=gen).tolist()
        width = max(len(encoded[i]) for i in idx)
        ids = torch.full((args.batch, width), pad_id)
        weights = torch.zeros((args.batch, width))
        for row, i in enumerate(idx):
            ids[row, : len(encoded[i])] = torch.tensor(encoded[i])
            weights[row, : len(encoded[i])] = torch.tensor(loss_weights(encoded[i], assistant_id, end_id))
        logits = model(input_ids=ids).logits[:, :-1]
        per_token = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
        loss = (per_token * weights[:, 1:].flatten()).sum() / weights[:, 1:].sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == 1:
            print(
                f"step {step}/{args.steps} loss {loss.item():.4f} lr {lr:.2e} {time.monotonic() - started:.0f}s",
                flush=True,
            )

    model.eval()
    model.generation_config.eos_token_id = end_id
    model.generation_config.pad_token_id = pad_id
    model.save_pretrained(tmp, safe_serialization=True)
    shutil.rmtree(args.out, ignore_errors=True)
    tmp.rename(args.out)
    print(f"saved {args.out} in {time.monotonic() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
