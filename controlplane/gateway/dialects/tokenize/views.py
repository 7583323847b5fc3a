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

from django.http import JsonResponse

from controlplane.deployments.models import Deployment
from controlplane.gateway import generation, tokenization
from controlplane.gateway.core import GatewayError, bad, read_json
from controlplane.gateway.dialects.tokenize.request import TokenizeRequest, parse_detokenize, parse_tokenize
from controlplane.gateway.http import api_view, bearer_caller
from workers.protocol.errors import RequestError

log = logging.getLogger(__name__)


def _text(deployment: Deployment) -> tokenization.ModelText:
    text = tokenization.model_text(deployment.model)
    if text is None:  # a hub model, or a directory this web process does not see
        raise GatewayError(
            501,
            f"The model '{deployment.slug}' cannot be tokenised here: the gateway cannot read "
            "its tokenizer (the replicas tokenise its requests).",
            "model",
        )
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
        raise bad(
            f"Token id {shown} in 'tokens' is out of vocabulary: this model's ids are 0 to {tok.vocab_size - 1}.",
            "tokens",
        )
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
