"""Turn a batch of logits into next tokens, honouring each request's SamplingParams.

Order (as in transformers / vLLM): penalties → temperature → top-k → top-p → min-p → sample.
Greedy rows take the argmax of the penalised logits. Seeded rows draw from a
`torch.Generator` seeded for each token from (seed, output position) alone: a seed reproduces
its output whatever else shares the batch, and a request resumed on another replica after N
tokens draws token N+1 exactly as the undisturbed run would have.
Log-probabilities are those of the model (raw logits), as vLLM reports them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.engine.sampling_params import SamplingParams


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]


def apply_penalties(logits: torch.Tensor, token_ids: list[int], num_prompt: int, p: SamplingParams) -> None:
    """In place on one row. Repetition penalty (CTRL/transformers) covers prompt and output;
    presence/frequency (OpenAI) cover the output only."""
    vocab = logits.shape[-1]
    if p.repetition_penalty != 1.0 and token_ids:
        seen = torch.tensor(sorted(set(token_ids)), dtype=torch.long, device=logits.device)
        seen = seen[seen < vocab]
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    out = token_ids[num_prompt:]
    if out and (p.presence_penalty or p.frequency_penalty):
        counts = torch.bincount(torch.tensor(out, dtype=torch.long, device=logits.device), minlength=vocab)[:vocab]
        logits -= p.frequency_penalty * counts.to(logits.dtype)
        logits -= p.presence_penalty * (counts > 0).to(logits.dtype)


def top_k_top_p_min_p(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Mask (to -inf) the tokens each filter removes, on one row of temperature-scaled logits."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=False)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        remove = cum <= 1 - top_p
        remove[-1] = False  # always keep the most likely token
        logits = logits.masked_fill(torch.zeros_like(remove).scatter(0, idx, remove), float("-inf"))
    if min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.max(), float("-inf"))
    return logits


_MASK64 = (1 << 64) - 1


def position_seed(seed: int, position: int) -> int:
    """The generator seed of output token `position` (0-based) of a request seeded `seed`:
    splitmix64 of the pair, so neighbouring positions and seeds get unrelated streams."""
    z = (seed + (position + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class Sampler:
    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)
        # Seeded rows: reseeded before each draw from (seed, output position) alone, so one
        # generator serves every seeded request and keeps nothing between draws.
        self.seeded = torch.Generator()

    def __call__(self, logits: torch.Tensor, seqs) -> SampleResult:
        """logits: [len(seqs), vocab] fp32 on any device; seqs: the Sequences, in row order."""
        logits = logits.float()
        want_logprobs = any(s.params.logprobs is not None for s in seqs)
        raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        if any(s.params.has_penalties for s in seqs):
            logits = logits.clone()
            for row, s in enumerate(seqs):
                if s.params.has_penalties:
                    apply_penalties(logits[row], s.token_ids, s.num_prompt_tokens, s.params)
        tokens = logits.argmax(dim=-1).tolist()
        for row, s in enumerate(seqs):
            p = s.params
            if p.greedy:
                continue
            scaled = top_k_top_p_min_p(logits[row] / p.temperature, p.top_k, p.top_p, p.min_p)
            probs = scaled.softmax(-1).cpu()
            # Exponential-race sampling: argmax(p / E) with E ~ Exp(1) draws from p.
            generator = self.generator
            if p.seed is not None:
                generator = self.seeded.manual_seed(position_seed(p.seed, s.num_output_tokens))
            noise = torch.empty_like(probs).exponential_(generator=generator)
            tokens[row] = int((probs / noise).argmax())
        logprobs: list[dict[int, float] | None] = [None] * len(seqs)
        if raw_logprobs is not None:
            for row, s in enumerate(seqs):
                n = s.params.logprobs
                if n is None:
                    continue
                lp = raw_logprobs[row]
                entry: dict[int, float] = {}
                if n > 0:
                    top = torch.topk(lp, min(n, lp.shape[-1]))  # a vocabulary smaller than n has no more
                    entry = dict(zip(top.indices.tolist(), top.values.tolist(), strict=True))
                entry[tokens[row]] = float(lp[tokens[row]])
                logprobs[row] = entry
        return SampleResult(tokens, logprobs)
