"""vLLM's `POST /tokenize` and `POST /detokenize` (also under /v1/), with the API key.

`/tokenize` takes a text `prompt` (`add_special_tokens`, default true) or chat `messages` (with
`tools`, `add_generation_prompt` default true, `add_special_tokens` default false: the template
writes its own) and answers `{"count", "max_model_len", "tokens"}` (`token_strs` too with
`return_token_strs`). With the defaults the ids are those a completion or chat completion of the
same prompt runs (tokenization.py: the replica's own tokenizer code), so `count` is the request's
`prompt_tokens`. `/detokenize` takes `tokens` and answers `{"prompt"}`, special tokens kept (as
vLLM does). Nothing is generated, so no rate limit applies; a deployment whose tokenizer the web
process cannot read (a hub model) is a 501, as for Anthropic's count_tokens.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from django.http import JsonResponse

from controlplane.deployments.models import Deployment
from controlplane.gateway import generation, tokenization
from controlplane.gateway.core import checks
from controlplane.gateway.core.body import read_json
from controlplane.gateway.core.errors import GatewayError, bad
from controlplane.gateway.http import api_view, bearer_caller
from controlplane.gateway.openai_request import parse_chat
from workers.protocol.errors import RequestError

log = logging.getLogger(__name__)

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
        raise bad("Send either 'prompt' (a text) or 'messages' (a chat), not both." if has_prompt
                  else "'prompt' or 'messages' is required.", "messages" if has_prompt else "prompt",
                  "invalid_value" if has_prompt else "missing")  # fmt: skip
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
        raise bad("'tokens' must be a list of token ids (integers).", "tokens",
                  "missing" if tokens is None else "invalid_type")  # fmt: skip
    return model, tokens


def _text(deployment: Deployment) -> tokenization.ModelText:
    text = tokenization.model_text(deployment.model)
    if text is None:  # a hub model, or a directory this web process does not see
        raise GatewayError(501, f"The model '{deployment.slug}' cannot be tokenised here: the gateway cannot read "
                           "its tokenizer (the replicas tokenise its requests).", "model")  # fmt: skip
    return text


def tokenize_ids(deployment: Deployment, req: TokenizeRequest) -> dict:
    """The answer to `req` (blocking: the caller runs it in a thread)."""
    text = _text(deployment)
    tok = text.tokenizer
    if req.messages is None:
        ids = tok.encode(req.prompt, add_special_tokens=req.add_special_tokens)
    else:
        try:
            rendered = tok.render_chat(req.messages, req.tools, add_generation_prompt=req.add_generation_prompt)
        except RequestError as exc:  # the template's raise_exception, or no chat template
            raise bad(str(exc), "messages") from None
        except (TypeError, ValueError, OverflowError, AttributeError) as exc:  # as tokenization.prompt_ids
            log.info("%s: the chat template failed: %s: %s", deployment.slug, type(exc).__name__, exc)
            raise bad("The request's messages could not be read.", "messages") from None
        ids = tok.encode(rendered, add_special_tokens=req.add_special_tokens)
    answer = {"count": len(ids), "max_model_len": tokenization.context_length(deployment), "tokens": ids}
    if req.return_token_strs:
        answer["token_strs"] = tok.token_strs(ids)
    return answer


def detokenize_text(deployment: Deployment, tokens: list[int]) -> str:
    tok = _text(deployment).tokenizer
    unknown = next((t for t in tokens if not 0 <= t < tok.vocab_size), None)
    if unknown is not None:
        shown = unknown if abs(unknown) < 10**30 else f"a {unknown.bit_length()}-bit integer"
        raise bad(f"Token id {shown} in 'tokens' is out of vocabulary: this model's ids are 0 to "
                  f"{tok.vocab_size - 1}.", "tokens")  # fmt: skip
    return tok.decode(tokens, skip_special_tokens=False)


@api_view(("POST",))
async def tokenize(request):
    caller = await bearer_caller(request)  # 401 before looking at the body
    req = parse_tokenize(read_json(request))
    deployment = await generation.resolve_deployment(req.model, caller)
    return JsonResponse(await asyncio.to_thread(tokenize_ids, deployment, req))


@api_view(("POST",))
async def detokenize(request):
    caller = await bearer_caller(request)
    model, tokens = parse_detokenize(read_json(request))
    deployment = await generation.resolve_deployment(model, caller)
    return JsonResponse({"prompt": await asyncio.to_thread(detokenize_text, deployment, tokens)})
