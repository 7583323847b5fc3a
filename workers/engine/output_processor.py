"""From sampled tokens to what a request sees: token ids, logprobs, text, and when it stops.

Per sequence: detokenisation (incremental), its grammar advanced (structured output), stop
conditions in order (stop token ids, EOS, the grammar's end, stop strings, `max_tokens`, the
context), and text held back while it could still be the start
of a stop string. A step may hand a sequence several tokens (speculative decoding accepts a
run of them); they are taken one at a time and whatever follows the one that finishes the
sequence is dropped, so a run behaves exactly as the same tokens arriving over several steps.

The engine owns the sequences' lifecycle (scheduler, blocks); this module only changes a
sequence's output state and says whether it finished.
"""

from __future__ import annotations

from workers.engine.outputs import RequestDelta
from workers.engine.sequence import Sequence
from workers.protocol.tokenizer import IncrementalDetokenizer, Tokenizer


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer | None, max_model_len: int):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len

    def attach(self, seq: Sequence) -> None:
        """Give a new sequence its detokenizer (when the model has a tokenizer)."""
        if self.tokenizer is not None:
            seq.detokenizer = IncrementalDetokenizer(
                self.tokenizer, seq.token_ids[: seq.num_prompt_tokens], seq.params.skip_special_tokens
            )

    def replay(self, seq: Sequence, emitted_text_len: int) -> None:
        """A resumed sequence's text so far, token by token as `process` built it."""
        stops = set(seq.params.stop_token_ids) | set(seq.eos_token_ids)
        if seq.detokenizer is not None:
            seq.text = "".join(seq.detokenizer.add(t) for t in seq.output_token_ids if t not in stops)
        seq.emitted_text_len = min(max(emitted_text_len, 0), len(seq.text))

    def process(self, seq: Sequence, token_ids: list[int], logprobs: list) -> RequestDelta:
        """Append `token_ids` (with their `logprobs` entries) until one finishes `seq`; the
        delta holds the tokens taken and the text that became visible."""
        taken = 0
        for token, entry in zip(token_ids, logprobs, strict=True):
            self._append(seq, token, entry)
            taken += 1
            if seq.finish_reason is not None:
                break
        p = seq.params
        finished = seq.finish_reason is not None
        # Hold back text that could still turn out to be the start of a stop string.
        hold = 0 if finished or not p.stop else p.max_stop_len - 1
        visible = max(len(seq.text) - hold, seq.emitted_text_len)
        new_text = seq.text[seq.emitted_text_len : visible]
        seq.emitted_text_len = visible
        return RequestDelta(
            request_id=seq.request_id,
            new_token_ids=list(token_ids[:taken]),
            new_text=new_text,
            new_logprobs=list(logprobs[:taken]) if seq.logprobs is not None else None,
            finished=finished,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            stop_reason=seq.stop_reason,
            index=seq.index,
            scheduled_at=seq.scheduled_at,
        )

    def _append(self, seq: Sequence, token: int, logprobs) -> None:
        p = seq.params
        seq.token_ids.append(token)
        if seq.logprobs is not None:
            seq.logprobs.append(logprobs)
        is_stop_token = token in p.stop_token_ids
        is_eos = token in seq.eos_token_ids
        if seq.detokenizer is not None and not (is_eos or is_stop_token):
            seq.text += seq.detokenizer.add(token)
        # A token the grammar refuses cannot come from this engine's sampler (its row was
        # masked); the grammar then stays where it was and the output ends here.
        grammar_done = seq.grammar is not None and (not seq.grammar.accept(token) or seq.grammar.terminated)
        if is_stop_token:
            seq.finish_reason, seq.stop_reason = "stop", token
        elif is_eos or grammar_done or (p.stop and self._check_stop_strings(seq)):
            seq.finish_reason = "stop"
        elif (p.max_tokens is not None and seq.num_output_tokens >= p.max_tokens) or (
            seq.num_tokens >= self.max_model_len
        ):
            seq.finish_reason = "length"

    @staticmethod
    def _check_stop_strings(seq: Sequence) -> bool:
        """Truncate the text at the first stop string; search only where a new one can start."""
        start = max(seq.emitted_text_len - seq.params.max_stop_len, 0)
        best = -1
        for s in seq.params.stop:
            i = seq.text.find(s, start)
            if i != -1 and (best == -1 or i < best):
                best, seq.stop_reason = i, s
        if best == -1:
            return False
        seq.text = seq.text[:best]
        return True
