"""Structured output: grammars compiled with xgrammar, and the token masks they give the sampler.

A request's `grammar` (SamplingParams.grammar, from the wire) says what its output must be:

    {"type": "json_object"}                            any JSON object
    {"type": "json_schema", "schema": {...}}           JSON valid against the schema
    {"type": "regex", "regex": "..."}                  a match of the regular expression
    {"type": "choice", "choice": ["a", "b"]}           exactly one of the strings
    {"type": "grammar", "grammar": "root ::= ..."}     xgrammar's EBNF (GBNF)
    {"type": "tool_call", "tools": [{"name", "parameters"}]}
        one call `<tool_call>{"name": N, "arguments": A}</tool_call>` (the format the chat
        templates render and the gateway's tool_calls.py parses), N one of the tools, A valid
        against that tool's parameter schema

`Grammars` compiles each spec once for the engine's vocabulary and keeps the compiled grammars
in a bounded LRU. Each constrained sequence owns a `GrammarState` (an xgrammar matcher) that has
accepted exactly its output tokens: the sampler masks the logits of its row with the state's
next-token bitmask, and the output processor advances it with every token taken. The state
lives on the sequence, so a preempted sequence (its K/V recomputed, its tokens kept) keeps it.
JSON is generated compact (`", "`, `": "`, no free whitespace), which keeps a small model from
filling its budget with blanks.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from workers.engine.errors import RequestError, first_line
from workers.engine.faults import injected_fault
from workers.engine.sampling_params import GRAMMAR_PARAMS as PARAMS
from workers.engine.sampling_params import check_grammar as check_spec

if TYPE_CHECKING:
    import xgrammar

CACHE_SIZE = 128  # compiled grammars kept (each is a few KB to a few MB with a large vocabulary)


def _xgr():
    """xgrammar, imported when the first grammar is compiled: it loads transformers, 0.8 s of CPU
    that an engine whose requests ask for no grammar would pay at every start."""
    import xgrammar

    return xgrammar


def _literal(text: str) -> str:
    """An EBNF string literal (xgrammar reads JSON's escapes)."""
    return json.dumps(text, ensure_ascii=False)


def _json_schema(schema) -> xgrammar.Grammar:
    return _xgr().Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)


def _tool_call(tools: list[dict]) -> xgrammar.Grammar:
    calls = []
    for tool in tools:
        head = '<tool_call>{"name": ' + json.dumps(tool["name"]) + ', "arguments": '
        # No parameters: the call takes none (`{}`), as OpenAI reads a tool without a schema.
        params = tool.get("parameters") or {"type": "object", "properties": {}, "additionalProperties": False}
        calls.append(
            _xgr().Grammar.concat(
                _xgr().Grammar.from_ebnf(f"root ::= {_literal(head)}"),
                _json_schema(params),
                _xgr().Grammar.from_ebnf('root ::= "}</tool_call>"'),
            )
        )
    return calls[0] if len(calls) == 1 else _xgr().Grammar.union(*calls)


def tokenizer_info(model_dir: str | Path, vocab_size: int, stop_token_ids) -> xgrammar.TokenizerInfo:
    """xgrammar's view of the model's vocabulary, read from tokenizer.json with the `tokenizers`
    library (no transformers). Special tokens (`<|user|>`, ...) are left out of every grammar:
    their text is not what detokenisation shows. The stop tokens end a grammar's output."""
    from tokenizers import Tokenizer

    path = Path(model_dir) / "tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    meta = _xgr().TokenizerInfo._detect_metadata_from_hf(path.read_text())
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    encoded = [""] * vocab_size
    for text, i in tok.get_vocab(with_added_tokens=True).items():
        if i < vocab_size and text not in special:
            encoded[i] = text
    return _xgr().TokenizerInfo(
        encoded,
        meta["vocab_type"],
        vocab_size=vocab_size,
        stop_token_ids=list(stop_token_ids),
        add_prefix_space=meta["add_prefix_space"],
    )


class Grammars:
    """Compiles grammar specs for one vocabulary, each once: a bounded LRU by the spec's JSON.
    The vocabulary is read for xgrammar when the first grammar is compiled, not at start."""

    def __init__(self, model_dir: str | Path, vocab_size: int, stop_token_ids, cache_size: int = CACHE_SIZE):
        self.model_dir, self.vocab_size, self.stop_token_ids = model_dir, vocab_size, list(stop_token_ids)
        self._compiler: xgrammar.GrammarCompiler | None = None
        self.cache: OrderedDict[str, xgrammar.CompiledGrammar] = OrderedDict()
        self.cache_size = cache_size
        self.compiles = 0  # how many specs were compiled (the rest were cache hits)
        self._lock = threading.Lock()  # a replica compiles on its intake thread, then on its loop

    @property
    def compiler(self) -> xgrammar.GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                info = tokenizer_info(self.model_dir, self.vocab_size, self.stop_token_ids)
                self._compiler = _xgr().GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return self._compiler

    def compile(self, spec: dict) -> xgrammar.CompiledGrammar:
        spec = check_spec(spec)
        key = json.dumps(spec, sort_keys=True)
        with self._lock:
            hit = self.cache.get(key)
            if hit is not None:
                self.cache.move_to_end(key)
                return hit
        compiled = self._compile(spec)
        with self._lock:
            self.cache[key] = compiled
            self.compiles += 1
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        return compiled

    def _compile(self, spec: dict) -> xgrammar.CompiledGrammar:
        kind = spec["type"]
        try:
            if kind == "json_object":
                return self.compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if kind == "json_schema":
                return self.compiler.compile_grammar(_json_schema(spec["schema"]))
            if kind == "regex":
                return self.compiler.compile_regex(spec["regex"])
            if kind == "choice":
                return self.compiler.compile_grammar("root ::= " + " | ".join(_literal(c) for c in spec["choice"]))
            if kind == "grammar":
                return self.compiler.compile_grammar(spec["grammar"])
            return self.compiler.compile_grammar(_tool_call(spec["tools"]))
        except (RuntimeError, ValueError, TypeError) as exc:
            what = {"json_object": "JSON", "json_schema": "JSON schema", "tool_call": "tool parameter schema"}
            cause = first_line(exc) or type(exc).__name__
            raise RequestError(
                f"cannot compile the {what.get(kind, kind)} into a grammar: {cause}", PARAMS[kind]
            ) from None

    def state(self, spec: dict) -> GrammarState:
        fault = injected_fault(spec, self.vocab_size)
        if fault is not None:
            return fault
        return GrammarState(self.compile(spec), self.vocab_size)


class GrammarState:
    """One sequence's place in its grammar: the tokens it accepted, the mask of the next."""

    __slots__ = ("matcher", "vocab_size")

    def __init__(self, compiled: xgrammar.CompiledGrammar, vocab_size: int):
        self.matcher = _xgr().GrammarMatcher(compiled)  # rolls back any number of tokens
        self.vocab_size = vocab_size

    def accept(self, token: int) -> bool:
        """Advance by `token`; False (state unchanged) when the grammar does not allow it."""
        return self.matcher.accept_token(token)

    def rollback(self, n: int) -> None:
        if n:
            self.matcher.rollback(n)

    @property
    def terminated(self) -> bool:
        """The grammar is complete and its stop token was taken: the output is done."""
        return self.matcher.is_terminated()

    def valid_prefix(self, tokens: list[int]) -> list[int]:
        """The longest prefix of `tokens` the grammar accepts from here, ending at the latest
        with the token that terminates it (a speculative draft is cut there before it is
        verified). The state is unchanged afterwards."""
        taken = 0
        for token in tokens:
            if self.matcher.is_terminated() or not self.matcher.accept_token(token):
                break
            taken += 1
        self.rollback(taken)
        return tokens[:taken]

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Row `row` of `bitmask`: the tokens allowed next. Past the grammar's end (its stop
        token taken: a verify row after a draft that ended the output) only the stop tokens are;
        xgrammar refuses to compute a mask there."""
        if self.matcher.is_terminated():
            only_tokens(bitmask, row, self.matcher.stop_token_ids)
        else:
            self.matcher.fill_next_token_bitmask(bitmask, row)


def only_tokens(bitmask: torch.Tensor, row: int, token_ids) -> None:
    """Set bitmask row `row` (int32 words, bit i of word w is token 32w + i) to allow exactly `token_ids`."""
    words = [0] * bitmask.shape[1]
    for token in token_ids:
        words[token // 32] |= 1 << (token % 32)
    bitmask[row] = torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)


def grammar_state(grammars: Grammars | None, spec: dict | None, output_token_ids=()) -> GrammarState | None:
    """A new sequence's grammar state (None without a grammar), compiled once per spec and
    advanced by the output a resumed request already has. RequestError naming the parameter for
    a grammar this engine cannot run (no tokenizer, does not compile, or the output does not match)."""
    if spec is None:
        return None
    param = PARAMS[spec["type"]]
    if grammars is None:
        raise RequestError("structured output needs the model's tokenizer (tokenizer.json)", param)
    state = grammars.state(spec)
    for token in output_token_ids:
        if not state.accept(token):
            raise RequestError("the output to resume does not match its grammar", param)
    return state


def allocate_masks(rows: int, vocab_size: int) -> torch.Tensor:
    return _xgr().allocate_token_bitmask(rows, vocab_size)


def apply_masks(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """In place: -inf on the tokens each listed row's bitmask forbids (other rows untouched)."""
    bitmask = bitmask[: logits.shape[0]].to(logits.device, non_blocking=True)
    _xgr().apply_token_bitmask_inplace(logits, bitmask, indices=rows)
