"""Parse and validate vLLM's `/tokenize` and `/detokenize` bodies (views.py answers them)."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.gateway.core import bad, checks
from controlplane.gateway.dialects.openai.request import parse_chat

TOKENIZE_PARAMS = {"model", "prompt", "messages", "tools", "add_special_tokens", "add_generation_prompt",
                   "return_token_strs"}  # fmt: skip
DETOKENIZE_PARAMS = {"model", "tokens"}
# vLLM parameters not built here: refused unless they ask for nothing (null, or their default).
NOT_BUILT = {
    "continue_final_message": ((False,), "'continue_final_message' is not built yet."),
    "chat_template": ((), "'chat_template' is not built yet: the model's own template is used."),
    "chat_template_kwargs": (({},), "'chat_template_kwargs' is not built yet."),
    "mm_processor_kwargs": (({},), "'mm_processor_kwargs' is not built yet: no multimodal model is served."),
}


@dataclass
class TokenizeRequest:
    model: str
    prompt: str | None = None
    messages: list[dict] | None = None
    tools: list[dict] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f"'{name}' must be a boolean.", name, "invalid_type")
    return value


def parse_tokenize(body: dict) -> TokenizeRequest:
    model = checks.model(body)
    checks.refuse_unknown(body, TOKENIZE_PARAMS, NOT_BUILT)
    has_prompt, has_messages = body.get("prompt") is not None, body.get("messages") is not None
    if has_prompt == has_messages:
        raise bad(
            "Send either 'prompt' (a text) or 'messages' (a chat), not both."
            if has_prompt
            else "'prompt' or 'messages' is required.",
            "messages" if has_prompt else "prompt",
            "invalid_value" if has_prompt else "missing",
        )
    req = TokenizeRequest(model=model, return_token_strs=_flag(body, "return_token_strs", False))
    if has_prompt:
        for name in ("tools", "add_generation_prompt"):
            if body.get(name) is not None:
                raise bad(f"'{name}' is for a chat ('messages'), not a 'prompt'.", name)
        if not isinstance(body["prompt"], str):
            raise bad("'prompt' must be a string.", "prompt", "invalid_type")
        req.prompt = body["prompt"]
        req.add_special_tokens = _flag(body, "add_special_tokens", True)
    else:
        # The chat endpoint's checks of messages and tools, so both read a conversation alike.
        chat = parse_chat({"model": model, "messages": body["messages"], "tools": body.get("tools")})
        req.messages, req.tools = chat.messages, chat.tools
        req.add_special_tokens = _flag(body, "add_special_tokens", False)
        req.add_generation_prompt = _flag(body, "add_generation_prompt", True)
    return req


def parse_detokenize(body: dict) -> tuple[str, list[int]]:
    model = checks.model(body)
    checks.refuse_unknown(body, DETOKENIZE_PARAMS, NOT_BUILT)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise bad(
            "'tokens' must be a list of token ids (integers).",
            "tokens",
            "missing" if tokens is None else "invalid_type",
        )
    return model, tokens
