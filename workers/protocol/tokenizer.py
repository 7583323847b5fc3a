"""Tokenizer (the `tokenizers` library over tokenizer.json), chat templates rendered in a jinja2
sandbox with transformers' `apply_chat_template` semantics, and incremental detokenisation.

Torch-free, so both ends use it: the gateway turns a request into token ids before it picks a
replica (KV-aware routing hashes them, the context check counts them), and the replica turns a
request sent as chat messages or text into the same ids (`Tokenizer.prompt_ids`), when a
gateway could not read the model's files. Its errors are neutral too: `TemplateError` is a
`workers.protocol.errors.RequestError` (the engine's), a broken directory a `ModelDirectoryError`
(the engine's `ModelLoadError`).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _HFTokenizer

from workers.protocol.errors import RequestError
from workers.protocol.model_files import ModelDirectoryError, model_file


def _token_str(value) -> str | None:
    """tokenizer_config.json spells special tokens as strings or AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value


class TemplateError(RequestError):
    """The chat template refused the conversation (raise_exception) or failed to render."""

    def __init__(self, message: str, param: str | None = "messages"):
        super().__init__(message, param)


class Tokenizer:
    def __init__(self, model_dir: str | Path):
        root = Path(model_dir)
        path = model_file(root, "tokenizer.json")
        if not path.is_file():
            raise ModelDirectoryError(f"{root}: no tokenizer.json (a fast tokenizer is required)")
        try:
            self._tok = _HFTokenizer.from_file(str(path))
        except Exception as exc:  # the library raises a bare Exception for malformed files
            raise ModelDirectoryError(f"{path}: cannot load tokenizer ({exc})") from exc
        cfg_path = model_file(root, "tokenizer_config.json")
        self.config: dict = {}
        if cfg_path.is_file():
            try:
                self.config = json.loads(cfg_path.read_text())
            except json.JSONDecodeError as exc:
                raise ModelDirectoryError(f"{cfg_path}: invalid JSON ({exc})") from exc
        self.chat_template = self._find_chat_template(root)
        self.special_tokens = {
            key: _token_str(self.config.get(key))
            for key in ("bos_token", "eos_token", "pad_token", "unk_token")
            if self.config.get(key) is not None
        }
        eos = self.special_tokens.get("eos_token")
        self.eos_token_id = self._tok.token_to_id(eos) if eos else None
        self.vocab_size = self._tok.get_vocab_size()
        self._template = None

    def _find_chat_template(self, root: Path) -> str | None:
        jinja_file = model_file(root, "chat_template.jinja")
        if jinja_file.is_file():
            return jinja_file.read_text()
        template = self.config.get("chat_template")
        if isinstance(template, list):  # named templates: use "default"
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        return template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_strs(self, ids: list[int]) -> list[str | None]:
        """Each id's token as the vocabulary spells it (byte-level BPE: `Ġ` for a space), as
        transformers' convert_ids_to_tokens; None for an id outside the vocabulary."""
        return [self._tok.id_to_token(i) for i in ids]

    # -- chat templates -----------------------------------------------------------------------
    def render_chat(
        self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True, **extra
    ) -> str:
        if not self.chat_template:
            raise TemplateError("this model has no chat template; use a completion prompt instead")
        if self._template is None:
            self._template = _compile_template(self.chat_template)
        try:
            return self._template.render(
                messages=messages,
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
                **extra,
            )
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template failed: {exc}") from exc

    def apply_chat_template(
        self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True, **extra
    ) -> list[int]:
        text = self.render_chat(messages, tools, add_generation_prompt, **extra)
        # Templates write their own special tokens (BOS...), as in transformers.
        return self.encode(text, add_special_tokens=False)

    def prompt_ids(
        self, messages: list[dict] | None = None, tools: list[dict] | None = None, prompt: str | None = None
    ) -> list[int]:
        """A request's prompt as the engine runs it: chat `messages` rendered with their `tools`,
        else the text `prompt` encoded. The gateway and the replica both call this, so what the
        gateway routes and checks is what the replica computes."""
        if messages is not None:
            return self.apply_chat_template(messages, tools=tools)
        return self.encode(prompt or "")


def _raise_exception(message: str):
    raise TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ModelDirectoryError(f"chat template has a syntax error: {exc}") from exc


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Decoding token by token is wrong for byte-level BPE (a character may span tokens) and for
    SentencePiece (leading spaces depend on context). We decode a short window ending at the new
    tokens and emit only what extends the window's previous text; an incomplete UTF-8 sequence
    (U+FFFD at the end) is held back until the next token completes it.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids = list(prompt_ids[-6:])
        self.prefix_offset = max(len(self.ids) - 5, 0)
        self.read_offset = len(self.ids)

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], self.skip)
        full = decode(self.ids[self.prefix_offset :], self.skip)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            # Keep the window short so each step decodes a bounded number of tokens.
            if self.prefix_offset > 64:
                drop = self.prefix_offset - 8
                self.ids = self.ids[drop:]
                self.prefix_offset -= drop
                self.read_offset -= drop
            return delta
        return ""
