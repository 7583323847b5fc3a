"""Turn a batch of logits into next tokens, honouring each request's SamplingParams.

Order (as in transformers / vLLM): penalties → temperature → top-k → top-p → min-p → sample.
Greedy rows take the argmax of the penalised logits. Seeded rows draw from a
`torch.Generator` seeded for each token from (seed, output position) alone: a seed reproduces
its output whatever else shares the batch, and a request resumed on another replica after N
tokens draws token N+1 exactly as the undisturbed run would have.
Log-probabilities are those of the model (raw logits), as vLLM reports them.
`logit_bias` (OpenAI) is added to a row's logits after the penalties, before the grammar mask,
greedy and sampling; rows without one are untouched, so they sample as in a batch without it.

`verify` checks speculative drafts (speculative/rejection.py) with the same per-row processing and the
same seeded draws, so speculation changes no output distribution, and no seeded output.

A sequence with a grammar (structured.py) has its row masked after the penalties: the tokens its
grammar forbids next become -inf, so greedy takes the best allowed token and sampling draws among
the allowed ones. Other rows are untouched: a free request samples exactly as in a batch without
constrained ones. In verification, the mask of the row after draft j is the grammar's state after
drafts[:j]: the matcher is advanced through the drafts and rolled back to where it was (the
output processor then advances it by the tokens actually taken). Drafts reach verification cut to
what the grammar accepts (GrammarState.valid_prefix), so every draft row has a reachable state;
a row after a draft that ended the grammar allows only its stop tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.engine.sampling_params import SamplingParams
from workers.engine.speculative.rejection import draw, rejection_sample
from workers.engine.structured import allocate_masks, apply_masks


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


def apply_logit_bias(logits: torch.Tensor, bias: dict[int, float]) -> None:
    """In place on one row: OpenAI's logit_bias, added to the (penalised) logits. Ids past the
    row (a vocabulary padded smaller than the tokenizer's) cannot be sampled anyway."""
    vocab = logits.shape[-1]
    ids = [t for t in bias if t < vocab]
    if ids:
        index = torch.tensor(ids, dtype=torch.long, device=logits.device)
        logits[index] += torch.tensor([bias[t] for t in ids], dtype=logits.dtype, device=logits.device)


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


class Ahead:
    """A sequence as it would stand after `draft` more tokens: what sampling the token after
    them reads (penalties over its tokens, the seed's output position, its parameters)."""

    __slots__ = ("draft", "seq")

    def __init__(self, seq, draft: list[int]):
        self.seq, self.draft = seq, draft

    @property
    def params(self) -> SamplingParams:
        return self.seq.params

    @property
    def num_prompt_tokens(self) -> int:
        return self.seq.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        return self.seq.num_output_tokens + len(self.draft)

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids + self.draft if self.draft else self.seq.token_ids

    @property
    def grammar(self):
        return self.seq.grammar


class Sampler:
    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)
        # Seeded rows: reseeded before each draw from (seed, output position) alone, so one
        # generator serves every seeded request and keeps nothing between draws.
        self.seeded = torch.Generator()
        self._bitmask: torch.Tensor | None = None  # grammar masks' buffer (structured output)
        self._bitmask_vocab = 0

    def __call__(self, logits: torch.Tensor, seqs) -> SampleResult:
        """logits: [len(seqs), vocab] fp32 on any device; seqs: the Sequences, in row order."""
        logits, raw_logprobs = self._prepare(logits, seqs)
        self._mask(logits, seqs)
        tokens = logits.argmax(dim=-1).tolist()
        for row, s in enumerate(seqs):
            if not s.params.greedy:
                tokens[row] = draw(self._probs(logits[row], s.params), self._generator(s))
        logprobs: list[dict[int, float] | None] = [None] * len(seqs)
        if raw_logprobs is not None:
            for row, s in enumerate(seqs):
                if s.params.logprobs is not None:
                    logprobs[row] = _logprob_entry(raw_logprobs[row], s.params.logprobs, tokens[row])
        return SampleResult(tokens, logprobs)

    def verify(
        self,
        logits: torch.Tensor,
        seqs,
        drafts: list[list[int]],
        draft_probs: list[torch.Tensor | None] | None = None,
    ) -> list[SampleResult]:
        """Speculative verification (speculative/rejection.py). `logits` has len(drafts[i]) + 1 rows
        per sequence, in order: row j is the target's prediction after the sequence's tokens
        and drafts[i][:j]. Each row is processed exactly as `__call__` would process the
        sequence at that point (its penalties count the drafts before it; a seed draws for
        that output position). Returns, per sequence, the tokens to emit (1 to k+1) and their
        logprobs from the target's raw logits."""
        rows = [Ahead(seq, draft[:j]) for seq, draft in zip(seqs, drafts, strict=True) for j in range(len(draft) + 1)]
        logits, raw_logprobs = self._prepare(logits, rows)
        self._mask(logits, rows, drafts)
        argmax = logits.argmax(dim=-1).tolist()
        results = []
        first = 0
        for i, (seq, draft) in enumerate(zip(seqs, drafts, strict=True)):
            p = seq.params
            if p.greedy:
                emitted = []
                for j, token in enumerate(argmax[first : first + len(draft) + 1]):
                    emitted.append(token)
                    if j == len(draft) or token != draft[j]:
                        break
            else:
                emitted = rejection_sample(
                    lambda j, first=first, p=p: self._probs(logits[first + j], p),
                    draft,
                    draft_probs[i] if draft_probs else None,
                    lambda j, first=first: self._generator(rows[first + j]),
                )
            entries: list[dict[int, float] | None] = [None] * len(emitted)
            if raw_logprobs is not None and p.logprobs is not None:
                entries = [_logprob_entry(raw_logprobs[first + j], p.logprobs, t) for j, t in enumerate(emitted)]
            results.append(SampleResult(emitted, entries))
            first += len(draft) + 1
        return results

    def sample_or_verify(
        self, logits: torch.Tensor, seqs, drafts: list[list[int]]
    ) -> list[tuple[list[int], list[dict[int, float] | None]]]:
        """One step's outcome per sequence, (tokens, logprobs): a sequence without a draft has
        one row of `logits` and samples one token (`__call__`); one with a draft has 1 +
        len(draft) rows and verifies it (`verify`). Rows are in sequence order."""
        if not any(drafts):
            result = self(logits, seqs)
            return [([t], [lp]) for t, lp in zip(result.token_ids, result.logprobs, strict=True)]
        plain_rows, verify_rows, row = [], [], 0
        for draft in drafts:
            (verify_rows if draft else plain_rows).extend(range(row, row + 1 + len(draft)))
            row += 1 + len(draft)
        plain = [i for i, draft in enumerate(drafts) if not draft]
        verifying = [i for i, draft in enumerate(drafts) if draft]
        outcomes: list = [None] * len(seqs)
        if plain:
            result = self(logits[plain_rows], [seqs[i] for i in plain])
            for i, token, lp in zip(plain, result.token_ids, result.logprobs, strict=True):
                outcomes[i] = ([token], [lp])
        verified = self.verify(logits[verify_rows], [seqs[i] for i in verifying], [drafts[i] for i in verifying])
        for i, result in zip(verifying, verified, strict=True):
            outcomes[i] = (result.token_ids, result.logprobs)
        return outcomes

    @staticmethod
    def _prepare(logits: torch.Tensor, rows) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(penalised fp32 logits, raw logprobs or None when no row asks for them)."""
        logits = logits.float()
        if any(s.grammar is not None for s in rows) and not any(
            s.params.has_penalties or s.params.logit_bias for s in rows
        ):
            logits = logits.clone()  # masked in place next: not the caller's tensor
        want_logprobs = any(s.params.logprobs is not None for s in rows)
        raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        biased = any(s.params.logit_bias for s in rows)
        if any(s.params.has_penalties for s in rows) or biased:
            logits = logits.clone()
            for row, s in enumerate(rows):
                if s.params.has_penalties:
                    apply_penalties(logits[row], s.token_ids, s.num_prompt_tokens, s.params)
        if biased:
            for row, s in enumerate(rows):
                if s.params.logit_bias:
                    apply_logit_bias(logits[row], s.params.logit_bias)
        return logits, raw_logprobs

    def _mask(self, logits: torch.Tensor, rows, drafts: list[list[int]] | None = None) -> None:
        """In place: each constrained row's grammar mask. Without `drafts`, one row per
        sequence in its current state; with them (verify), the rows of sequence i are its
        state after drafts[i][:j], j = 0..len(drafts[i])."""
        if not any(r.grammar is not None for r in rows):
            return
        vocab = next(r.grammar for r in rows if r.grammar is not None).vocab_size
        if self._bitmask is None or self._bitmask.shape[0] < len(rows) or self._bitmask_vocab != vocab:
            # Kept across steps (only the rows filled this step are applied); grown as needed.
            self._bitmask, self._bitmask_vocab = allocate_masks(max(len(rows), 64), vocab), vocab
        bitmask = self._bitmask
        masked = []
        if drafts is None:
            for row, s in enumerate(rows):
                if s.grammar is not None:
                    s.grammar.fill(bitmask, row)
                    masked.append(row)
        else:
            first = 0
            for draft in drafts:
                grammar = rows[first].grammar
                if grammar is not None:
                    accepted = 0
                    for j in range(len(draft) + 1):
                        grammar.fill(bitmask, first + j)  # past the grammar's end: only its stop tokens
                        masked.append(first + j)
                        # The engine cut each draft to what the grammar accepts (valid_prefix); rows
                        # past a refused draft would stay free: never emitted.
                        if j == len(draft) or not grammar.accept(draft[j]):
                            break
                        accepted += 1
                    grammar.rollback(accepted)
                first += len(draft) + 1
        apply_masks(logits, bitmask, masked)

    @staticmethod
    def _probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
        """One row's sampling distribution (on the CPU): temperature, then the filters."""
        return top_k_top_p_min_p(logits / p.temperature, p.top_k, p.top_p, p.min_p).softmax(-1).cpu()

    def _generator(self, s) -> torch.Generator:
        if s.params.seed is None:
            return self.generator
        return self.seeded.manual_seed(position_seed(s.params.seed, s.num_output_tokens))


def _logprob_entry(lp: torch.Tensor, n: int, token: int) -> dict[int, float]:
    """The top `n` logprobs of a row, and always the emitted token's."""
    entry: dict[int, float] = {}
    if n > 0:
        top = torch.topk(lp, min(n, lp.shape[-1]))  # a vocabulary smaller than n has no more
        entry = dict(zip(top.indices.tolist(), top.values.tolist(), strict=True))
    entry[token] = float(lp[token])
    return entry
