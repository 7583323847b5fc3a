"""EAGLE-3: a one-layer draft head that reads the target's own hidden states.

The head (Li et al., "EAGLE-3", 2025) fuses the target's hidden states at a low, a middle and
a high layer (`fc`: 3·target_hidden → hidden), and runs one decoder layer whose attention input
is the token's embedding and that fused state side by side (2·hidden wide); its LM head speaks
a reduced draft vocabulary, mapped to target ids by `d2t`. The checkpoint layout is the public
one (workers/protocol/draft_models.py reads and checks it without torch).

One head entry per position p: the target's fused state at p with the token at p+1, predicting
the token at p+2 (positions and tokens as vLLM pairs them). Drafting a run of k:

    observe  after a target step that the next one drafts from, the rows the target computed
             and kept (prefill chunks, a decode's last token, a verify's last token and its
             accepted drafts) go through the head once, the whole batch in one pass; their K/V
             is kept as each sequence's head context.
    propose  the last entry's output gives the first guess; each further guess feeds the
             previous entry's output state (no fc: it is already `hidden` wide) with the guess
             just made, one position on, every sequence in one pass. Those entries' K/V is
             scratch, overwritten by the next observe.

`DraftPass` runs the head's forward for both as bare tensor ops (the modules are the
definition, which training differentiates through). Only attention runs per sequence.

The head's context lives per sequence in a plain buffer, not the paged cache: it holds only
positions whose target states this engine computed, so a prefix-cache hit, a prompt another
replica prefilled, or steps too large to speculate (the head is not fed then: it would cost a
quarter of a 4-layer target step for nothing) start it partway. Drafts are then worse, never
wrong: the target verifies every guess. A context that starts inside the answer (the batch
shrank below the speculation threshold mid-answer) drafts nothing: measured, its drafts did not
pay for their verification.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from workers.engine import kernels
from workers.engine.config import RopeConfig, rope_from
from workers.engine.errors import ModelLoadError
from workers.engine.layers.linear import Linear
from workers.engine.layers.norm import RMSNorm
from workers.engine.layers.quantized import prepare_linears
from workers.engine.layers.rotary import cos_sin_table
from workers.engine.sequence import Sequence
from workers.engine.speculative.drafter import Drafter
from workers.protocol.draft_models import Eagle3Spec, read_eagle3
from workers.protocol.model_files import ModelDirectoryError, read_config

# Each of our parameters → the checkpoint tensors it is made of (stacked in row order: q/k/v and
# gate/up are fused, one matmul each).
_CHECKPOINT_NAMES = {
    "fc.weight": ("fc.weight",),
    "input_layernorm.weight": ("midlayer.input_layernorm.weight",),
    "hidden_norm.weight": ("midlayer.hidden_norm.weight",),
    "qkv_proj.weight": tuple(f"midlayer.self_attn.{p}_proj.weight" for p in "qkv"),
    "o_proj.weight": ("midlayer.self_attn.o_proj.weight",),
    "post_attention_layernorm.weight": ("midlayer.post_attention_layernorm.weight",),
    "gate_up_proj.weight": ("midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight"),
    "down_proj.weight": ("midlayer.mlp.down_proj.weight",),
    "norm.weight": ("norm.weight",),
    "lm_head.weight": ("lm_head.weight",),
}


def rotate(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on x [tokens, heads, head_dim] by each token's cos/sin row, written
    with plain ops so training can differentiate through it (the kernel writes in place)."""
    half = x.shape[-1] // 2
    cos, sin = cos_sin[:, None, :half].to(x.dtype), cos_sin[:, None, half:].to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Eagle3Head(nn.Module):
    """The head's weights and its forward pieces; attention over its context is the caller's
    (the drafter's causal chunk here, the trainer's unrolled pattern in workers/draft_training)."""

    def __init__(self, spec: Eagle3Spec, rope: RopeConfig, embed_tokens: nn.Embedding | None = None):
        super().__init__()
        self.spec = spec
        h, hd = spec.hidden_size, spec.head_dim
        self.q_size, self.kv_size = spec.num_heads * hd, spec.num_kv_heads * hd
        self.fc = Linear(3 * spec.target_hidden_size, h, bias=False)
        self.input_layernorm = RMSNorm(h, spec.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, spec.rms_norm_eps)
        self.qkv_proj = Linear(2 * h, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = Linear(self.q_size, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, spec.rms_norm_eps)
        self.gate_up_proj = Linear(h, 2 * spec.intermediate_size, bias=False)
        self.down_proj = Linear(spec.intermediate_size, h, bias=False)
        self.norm = RMSNorm(h, spec.rms_norm_eps)
        self.lm_head = Linear(h, spec.draft_vocab_size, bias=False)
        # Shared with the target unless the checkpoint has its own (then load_weights makes one).
        self.embed_tokens = embed_tokens
        self.register_buffer("draft_to_target", torch.arange(spec.draft_vocab_size), persistent=False)
        self.register_buffer("cos_sin", cos_sin_table(hd, spec.max_position_embeddings, rope), persistent=False)

    # -- the forward, in pieces ---------------------------------------------------------------
    def fuse(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """The target's three hidden states [n, 3·target_hidden] → the head's [n, hidden]."""
        return self.fc(aux_hidden)

    def attention_inputs(self, token_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """(q, k, v, residual) for entries of (token, state): q [n, heads, hd], k/v [n, kv_heads, hd]."""
        spec, hd = self.spec, self.spec.head_dim
        x = torch.cat((self.input_layernorm(self.embed_tokens(token_ids)), self.hidden_norm(hidden)), dim=-1)
        qkv = self.qkv_proj(x)
        rope = self.cos_sin.index_select(0, positions)
        v = qkv[:, self.q_size + self.kv_size :].reshape(-1, spec.num_kv_heads, hd)
        qk = qkv[:, : self.q_size + self.kv_size].reshape(-1, spec.num_heads + spec.num_kv_heads, hd)
        # Without grad one kernel call turns q and k; training needs the differentiable form.
        qk = rotate(qk, rope) if torch.is_grad_enabled() else kernels.apply_rotary(qk, rope)
        q, k = qk.split((spec.num_heads, spec.num_kv_heads), dim=1)
        return q, k, v, hidden

    def finish(self, attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Attention output [n, heads, hd] → the entry's state before the final norm, which is
        both what the LM head reads (after `norm`) and the next draft step's input state."""
        residual = self.o_proj(attn_out.reshape(-1, self.q_size)) + residual
        mlp_in = self.post_attention_layernorm(residual)
        return self.down_proj(kernels.silu_and_mul(self.gate_up_proj(mlp_in))) + residual

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of states before the norm."""
        return self.lm_head(self.norm(state))

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.draft_to_target[draft_ids]

    # -- loading --------------------------------------------------------------------------------
    @torch.no_grad()
    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy a checkpoint (its tensor names) into place; ModelLoadError names what is off."""
        tensors = dict(tensors)
        d2t = tensors.pop("d2t", None)
        tensors.pop("t2d", None)  # the inverse map: the engine needs only d2t
        embed = tensors.pop("embed_tokens.weight", None)
        own = {name: p for name, p in self.named_parameters() if not name.startswith("embed_tokens.")}
        for ours, names in _CHECKPOINT_NAMES.items():
            missing = [n for n in names if n not in tensors]
            if missing:
                raise ModelLoadError(f"EAGLE-3 checkpoint is missing {', '.join(missing)}")
            tensor = torch.cat([tensors.pop(n) for n in names])
            if own[ours].shape != tensor.shape:
                raise ModelLoadError(
                    f"EAGLE-3 checkpoint tensors {', '.join(names)} make shape {tuple(tensor.shape)}, "
                    f"expected {tuple(own[ours].shape)}"
                )
            own[ours].copy_(tensor)
        if tensors:
            raise ModelLoadError(f"EAGLE-3 checkpoint tensors {sorted(tensors)[:5]} have no place in the head")
        if d2t is not None:
            self.draft_to_target.add_(d2t.to(self.draft_to_target))
        if embed is not None:
            self.embed_tokens = nn.Embedding.from_pretrained(embed.to(self.fc.weight), freeze=True)
        if self.embed_tokens is None:
            raise ModelLoadError("the EAGLE-3 head has no embed_tokens and no target embedding was given")
        if int(self.draft_to_target.max()) >= self.spec.vocab_size or int(self.draft_to_target.min()) < 0:
            raise ModelLoadError("the EAGLE-3 head's d2t maps draft ids outside the target vocabulary")


NORMS = ("input_layernorm", "hidden_norm", "post_attention_layernorm", "norm")


def fold_norm_weights(head: Eagle3Head) -> None:
    """Fold each RMSNorm's weight into the linear layer that reads the norm's output, and set
    the norm's weight to 1: the head computes the same function (up to rounding), and drafting
    (`DraftPass`) normalises with fewer ops."""
    with torch.no_grad():
        head.qkv_proj.weight.mul_(torch.cat((head.input_layernorm.weight, head.hidden_norm.weight)))
        head.gate_up_proj.weight.mul_(head.post_attention_layernorm.weight)
        head.lm_head.weight.mul_(head.norm.weight)
        for name in NORMS:
            getattr(head, name).weight.fill_(1.0)


class DraftPass:
    """The head's forward for drafting, as bare tensor ops on tensors taken from it once.

    On a model this small each op costs about the same whatever its size (CPU dispatch, GPU
    launches), so the pass is written for few ops: no module calls, residual adds inside
    `addmm`, the norms' weights in the matmuls after them (a folded head: `fold_norm_weights`),
    the rotary rows of a run gathered once, and on CPU in fp32 the rotary as one complex multiply.
    The modules (Eagle3Head's pieces) stay the definition: training differentiates through them,
    and tests check that the engine's drafts are the trained head's predictions."""

    def __init__(self, head: Eagle3Head, complex_rope: bool | None = None):
        """`complex_rope`: turn q and k as complex numbers (default: on CPU in fp32). Each head's
        dims then come out paired, (0, d/2), (1, d/2 + 1) .. side by side: the same permutation
        of q and k, so attention scores are unchanged, and only this pass reads the head's K/V."""
        spec = head.spec
        unfolded = [name for name in NORMS if not bool((getattr(head, name).weight == 1).all())]
        if unfolded:
            raise ValueError(f"DraftPass needs a head with its norm weights folded (fold_norm_weights): {unfolded}")
        self.heads, self.kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.qk_size = head.q_size + head.kv_size
        self.q_size = head.q_size
        self.eps = spec.rms_norm_eps

        def weight(layer: Linear) -> torch.Tensor:  # [in, out], as `x @ w` reads it
            return layer.weight_t if layer.weight_t is not None else layer.weight.t()

        self.fc, self.qkv, self.o, self.gate_up, self.down, self.lm_head = (
            weight(m) for m in (head.fc, head.qkv_proj, head.o_proj, head.gate_up_proj, head.down_proj, head.lm_head)
        )
        self.ones = torch.ones_like(head.norm.weight)  # every norm's weight, once folded
        self.embed = head.embed_tokens.weight
        cos_sin = head.cos_sin
        if complex_rope is None:
            complex_rope = cos_sin.device.type == "cpu" and self.fc.dtype == torch.float32
        self.complex_rope = complex_rope
        if complex_rope:  # cos + i sin, one row a position (a copy of the head's table's size)
            half = self.head_dim // 2
            cos_sin = torch.complex(cos_sin[:, :half].float(), cos_sin[:, half:].float())
        self.rope_table = cos_sin  # row p turns an entry at position p (`attention_inputs`)
        # fp16 keeps the final norm: an unnormalised state's logits can pass its range.
        self.final_norm = self.fc.dtype == torch.float16
        # None: the draft ids are the target's (a full-vocabulary head, d2t all zeros), no gather.
        d2t = head.draft_to_target
        same = torch.equal(d2t, torch.arange(spec.vocab_size, device=d2t.device))
        self.draft_to_target = None if same else d2t

    def fuse(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        return aux_hidden @ self.fc

    def attention_inputs(self, token_ids: torch.Tensor, hidden: torch.Tensor, rope: torch.Tensor):
        """(q, k, v) for entries of (token, state) turned by their rows of `rope_table`, as
        Eagle3Head.attention_inputs (the residual is `hidden` itself). The embedding and the
        state are normalised side by side, one op."""
        n = hidden.shape[0]
        x = torch.cat((self.embed.index_select(0, token_ids), hidden), dim=-1).view(n, 2, -1)
        qkv = kernels.rms_norm(x, self.ones, self.eps).view(n, -1) @ self.qkv
        qk_heads, hd = self.heads + self.kv_heads, self.head_dim
        if self.complex_rope:  # (x1 + i x2)(cos + i sin) is the rotate-half rotary
            pairs = qkv[:, : self.qk_size].view(n, qk_heads, 2, hd // 2).transpose(-1, -2).contiguous()
            turned = torch.view_as_real(torch.view_as_complex(pairs) * rope[:, None]).view(n, qk_heads, hd)
        else:
            turned = kernels.apply_rotary(qkv[:, : self.qk_size].view(n, qk_heads, hd), rope)
        v = qkv[:, self.qk_size :].view(n, self.kv_heads, hd)
        return turned[:, : self.heads], turned[:, self.heads :], v

    def finish(self, attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        residual = torch.addmm(residual, attn_out.reshape(-1, self.q_size), self.o)
        gate_up = kernels.rms_norm(residual, self.ones, self.eps) @ self.gate_up
        act = kernels.silu_and_mul(gate_up)
        return torch.addmm(residual, act, self.down)

    def next_tokens(self, state: torch.Tensor) -> torch.Tensor:
        """The greedy guess (target ids) of each state before the final norm, which only scales
        the row by a positive number once its weight is in the LM head (so it keeps the argmax,
        up to rounding) and is skipped but in fp16."""
        if self.final_norm:
            state = kernels.rms_norm(state, self.ones, self.eps)
        ids = (state @ self.lm_head).argmax(dim=-1)
        return ids if self.draft_to_target is None else self.draft_to_target[ids]


def load_eagle3(
    draft_dir: str | Path,
    target_config: dict,
    target_embed: Callable[[], nn.Embedding],
    device: torch.device,
    dtype: torch.dtype,
) -> Eagle3Head:
    """The head in `draft_dir`, checked against its target, on `device` in `dtype`, for inference:
    its norm weights folded into its matmuls (`fold_norm_weights`, before the cast, so the
    products are rounded once), so its parameters are no longer the checkpoint's.
    `target_embed()` gives the target's embedding, asked for only when the head has none."""
    from workers.engine.loader import iter_tensors
    from workers.protocol.draft_models import draft_fit_problems

    try:
        spec = read_eagle3(draft_dir)
        raw = read_config(draft_dir)
    except ModelDirectoryError as exc:
        raise ModelLoadError(str(exc)) from exc
    problems = draft_fit_problems(spec, target_config)
    if problems:
        raise ModelLoadError(f"draft {draft_dir} does not fit the target: {'; '.join(problems)}")
    tensors = dict(iter_tensors(draft_dir))
    head = Eagle3Head(spec, rope_from(raw), None if "embed_tokens.weight" in tensors else target_embed())
    head.load_weights(tensors)
    fold_norm_weights(head)
    head = head.to(device=device, dtype=dtype)  # floating tensors only: d2t stays int64
    prepare_linears(head)
    return head.eval()


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """The parts one after another (the part itself when there is one: no copy)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def head_aux_layers(draft_dir: str | Path, target_dir: str | Path, num_layers: int) -> tuple[int, ...]:
    """The target layers the head in `draft_dir` reads, once it is checked to fit the target
    (ModelLoadError naming why not): what every rank of a parallel group needs to know before
    the head itself loads on rank 0."""
    from workers.protocol.draft_models import check_draft_dir

    try:
        return check_draft_dir(draft_dir, target_dir).aux_layers(num_layers)
    except ModelDirectoryError as exc:
        raise ModelLoadError(str(exc)) from exc


def head_has_embedding(draft_dir: str | Path) -> bool:
    """Whether the head ships its own `embed_tokens` (else it shares the target's)."""
    from workers.protocol.draft_models import safetensors_header
    from workers.protocol.model_files import weight_files

    try:
        return any("embed_tokens.weight" in safetensors_header(path) for path in weight_files(draft_dir))
    except ModelDirectoryError as exc:
        raise ModelLoadError(str(exc)) from exc


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arange: torch.Tensor) -> torch.Tensor:
    """q [n, heads, hd] for the last n of the m entries in k/v [m, kv_heads, hd]; each query
    sees the entries up to and including its own. `arange`: 0, 1, .. (at least m) on q's
    device, from which the mask is one comparison."""
    n, m = q.shape[0], k.shape[0]
    # 4-D [1, heads, tokens, hd]: on CPU, 3-D inputs miss SDPA's fused kernel (2.5x slower for
    # a draft step's one query, 4x for a prompt's observe).
    qt, kt, vt = (x.transpose(0, 1)[None] for x in (q, k, v))
    if n == m or n == 1:  # the whole context (a prompt) or one query that sees all of it
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=n > 1, enable_gqa=True)
    else:
        mask = arange[:m] <= arange[m - n : m, None]
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True)
    return out[0].transpose(0, 1)


class _KV:
    """A sequence's head K/V in a buffer that grows by doubling, so each entry is written once
    rather than the whole context copied by every step's concatenation."""

    __slots__ = ("k", "length", "v")

    def __init__(self, like: torch.Tensor, capacity: int):
        self.k = like.new_empty((capacity, *like.shape[1:]))
        self.v = like.new_empty((capacity, *like.shape[1:]))
        self.length = 0

    def extend(self, k: torch.Tensor, v: torch.Tensor, at: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k/v at entries at.. and return the K/V up to them; `at` < length overwrites a
        draft run's entries (they are never kept)."""
        end = at + k.shape[0]
        if end > self.k.shape[0]:
            grown = max(end, 2 * self.k.shape[0])
            self.k = torch.cat((self.k[:at], self.k.new_empty((grown - at, *self.k.shape[1:]))))
            self.v = torch.cat((self.v[:at], self.v.new_empty((grown - at, *self.v.shape[1:]))))
        self.k[at:end] = k
        self.v[at:end] = v
        return self.k[:end], self.v[:end]


class _Context:
    """One sequence's head context: K/V of its observed entries, and where it stands."""

    __slots__ = ("drafts", "kv", "last_state", "next_position", "observed")

    def __init__(self, position: int, drafts: bool):
        self.next_position = position  # the position the next observed entry must have
        self.drafts = drafts  # False: the head missed part of the answer (see Eagle3Drafter.observe)
        self.kv: _KV | None = None
        self.observed = 0  # entries of kv that are observed (after them: a draft run's, scratch)
        self.last_state: torch.Tensor | None = None


class Eagle3Drafter(Drafter):
    def __init__(self, head: Eagle3Head, num_speculative_tokens: int, aux_layer_ids: tuple[int, ...]):
        self.head = head
        self.draft = DraftPass(head)
        self.k = num_speculative_tokens
        self.aux_layer_ids = aux_layer_ids
        self.contexts: weakref.WeakKeyDictionary[Sequence, _Context] = weakref.WeakKeyDictionary()
        self._device = head.fc.weight.device
        self.max_positions = head.spec.max_position_embeddings
        self._arange = torch.arange(self.max_positions, device=self._device)

    @torch.inference_mode()
    def observe(self, entries: list[tuple[Sequence, int, torch.Tensor]]) -> None:
        """Feed each sequence's kept rows through the head: one batched pass over all of them,
        attention per sequence over its own context."""
        work: list[tuple[_Context, int]] = []
        tokens: list[int] = []
        states, ropes = [], []
        for seq, start, aux_hidden in entries:
            ctx = self.contexts.get(seq)
            if ctx is None or ctx.next_position != start:  # new, recomputed after preemption, or a gap
                # A context that starts inside the answer (the batch was too large to feed the head
                # until now) lacks the answer's first states: its drafts were accepted at 1.7-2.4
                # against 3.3-3.7 (bench spec, batch 8), too few to pay for the verify. It drafts
                # nothing. One that starts inside the prompt (a prefix-cache hit, the decode role)
                # has seen the whole answer and drafts.
                ctx = self.contexts[seq] = _Context(start, drafts=start <= seq.num_prompt_tokens)
            following = seq.token_ids[start + 1 : start + 1 + aux_hidden.shape[0]]  # each row's next token
            n = len(following)
            if start + n + self.k > self.max_positions:  # past the head's context: it drafts no more
                self.contexts.pop(seq, None)
                continue
            if n and not ctx.drafts:  # it will never draft: keep its place, spare the head the work
                ctx.next_position = start + n
            elif n:
                work.append((ctx, n))
                tokens.extend(following)
                states.append(aux_hidden[:n])
                ropes.append(self.draft.rope_table[start : start + n])
                ctx.next_position = start + n
        if not work:
            return
        draft = self.draft
        token_ids = torch.tensor(tokens, device=self._device)
        residual = draft.fuse(_joined(states))
        q, k, v = draft.attention_inputs(token_ids, residual, _joined(ropes))
        outs, row = [], 0
        for ctx, n in work:
            if ctx.kv is None:
                ctx.kv = _KV(k, max(64, 2 * n + self.k))
            k_all, v_all = ctx.kv.extend(k[row : row + n], v[row : row + n], ctx.observed)
            outs.append(causal_attention(q[row : row + n], k_all, v_all, self._arange))
            ctx.observed += n
            row += n
        out = draft.finish(_joined(outs), residual)
        row = 0
        for ctx, n in work:
            row += n
            ctx.last_state = out[row - 1 : row]

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], max_tokens: list[int]) -> list[list[int]]:
        """Every sequence's run in one batched pass per draft step (attention per sequence)."""
        drafts: list[list[int]] = [[] for _ in seqs]
        active = []
        for i, (seq, limit) in enumerate(zip(seqs, max_tokens, strict=True)):
            ctx = self.contexts.get(seq)
            if (
                ctx is not None
                and ctx.drafts
                and ctx.last_state is not None
                and ctx.next_position == seq.num_tokens - 1
            ):
                active.append((i, ctx, min(self.k, limit)))
            # else: the head has not seen this sequence's latest state (it drafts from the next step)
        if not active:
            return drafts
        draft = self.draft
        state = _joined([ctx.last_state for _, ctx, _ in active])
        token = draft.next_tokens(state)
        guesses = [token]
        steps = max(n for _, _, n in active) - 1
        # The rotary rows of the run's positions, [steps, seqs, ...]: step j's rows contiguous
        # (a view for one sequence).
        ropes = [draft.rope_table[ctx.next_position : ctx.next_position + steps] for _, ctx, _ in active]
        rope = ropes[0][:, None] if len(ropes) == 1 else torch.stack(ropes, dim=1)
        for j in range(steps):
            q, k, v = draft.attention_inputs(token, state, rope[j])
            outs = []
            for r, (_, ctx, _) in enumerate(active):
                # Entries past the observed ones are scratch: the next observe overwrites them.
                k_all, v_all = ctx.kv.extend(k[r : r + 1], v[r : r + 1], ctx.observed + j)
                outs.append(causal_attention(q[r : r + 1], k_all, v_all, self._arange))
            state = draft.finish(_joined(outs), state)
            token = draft.next_tokens(state)
            guesses.append(token)
        table = torch.stack(guesses, dim=1).tolist()
        for (i, _, n), row in zip(active, table, strict=True):
            drafts[i] = row[:n]
        return drafts

    def release(self, seq: Sequence) -> None:
        self.contexts.pop(seq, None)
