"""The gateway tokenises prompts before it picks a replica.

KV-aware routing hashes the prompt's blocks of token ids, and the context check and the usage a
request will count are exact only in tokens, so the gateway turns each request into the ids the
replica will run: with the replica's own code (`Tokenizer.prompt_ids` in the torch-free
workers/protocol/tokenizer.py: a chat rendered with its tools by the model's template, a text
prompt encoded), read from the deployment's model directory (`Model.source`, the directory the
replica spec names). The replica is sent the ids, not the messages.

Each web process keeps the tokenizers of a few directories (an LRU keyed by the directory and
its tokenizer.json's mtime, so a replaced tokenizer is read again) and loads and tokenises in a
thread, off the event loop.

Where the gateway cannot read the model (a hub model, whose files live on the GPU nodes only;
a directory not mounted on the web host; broken files), it says so once in its log and sends
the request as before: the replica tokenises it, and the router has no ids to route by.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from pathlib import Path

from controlplane.catalog.models import Model
from controlplane.deployments.models import Deployment
from controlplane.gateway.core import GatewayError, GenerationRequest, bad, bare
from workers.protocol.errors import RequestError
from workers.protocol.model_files import ModelDirectoryError, max_context, model_file, read_config, served_context
from workers.protocol.tokenizer import Tokenizer

log = logging.getLogger(__name__)
CACHED_MODELS = 4
_reported: set[str] = set()  # models the gateway could not read, logged once each


@dataclass(frozen=True)
class ModelText:
    """What the gateway reads of a model directory: its tokenizer and the longest context the
    model serves (workers/protocol/model_files.max_context, the engine's rule)."""

    tokenizer: Tokenizer
    max_context: int


def _unreadable(model: Model, why: object) -> None:
    if model.source not in _reported:
        _reported.add(model.source)
        log.warning(
            "model %s (%s): the gateway cannot tokenise its prompts (%s); its requests are sent "
            "untokenised, routed without their token ids",
            model.name,
            model.source,
            why,
        )


@functools.lru_cache(maxsize=CACHED_MODELS)
def _load(directory: str, mtime_ns: int) -> ModelText | ModelDirectoryError | OSError:
    """Loaded once per version of the tokenizer; a failure is kept too (not retried per request)."""
    try:
        return ModelText(Tokenizer(directory), max_context(read_config(directory)))
    except (ModelDirectoryError, OSError) as exc:
        return exc.with_traceback(None)  # kept: its frames need not be
    except (TypeError, ValueError) as exc:  # config.json's numbers are not numbers
        return ModelDirectoryError(f"{directory}/config.json: {exc}")


def model_text(model: Model) -> ModelText | None:
    """The model's tokenizer and context, or None when this web process cannot read them."""
    if model.source_type != Model.Source.LOCAL or not Path(model.source).is_absolute():
        _unreadable(model, "not a local directory")
        return None
    try:
        mtime = model_file(model.source, "tokenizer.json").stat().st_mtime_ns
    except (ModelDirectoryError, OSError) as exc:
        _unreadable(model, exc)
        return None
    loaded = _load(model.source, mtime)
    if not isinstance(loaded, ModelText):
        _unreadable(model, loaded)
        return None
    return loaded


def prompt_ids(deployment: Deployment, req: GenerationRequest) -> list[int] | None:
    """The ids the deployment's replicas run for `req` (the client's own ids pass through); None
    when the gateway cannot read the model. Raises GatewayError 400 for a conversation the chat
    template refuses or cannot render, as the replica would."""
    if req.prompt_token_ids is not None:
        return req.prompt_token_ids
    text = model_text(deployment.model)
    if text is None:
        return None
    try:
        return text.tokenizer.prompt_ids(req.messages, req.template_tools, req.prompt)
    except RequestError as exc:  # the template's raise_exception, or no chat template
        raise bad(str(exc), _param(req, exc.param)) from None
    except (TypeError, ValueError, OverflowError, AttributeError) as exc:
        # What the template could not render (the replica answers the same): the details go to
        # the log, the client learns which part to fix.
        log.info("%s: the chat template failed: %s: %s", deployment.slug, type(exc).__name__, exc)
        param = _param(req, "prompt")
        raise bad(f"The request's {param} could not be read.", param) from None


def context_length(deployment: Deployment) -> int | None:
    """The context the deployment's replicas serve (the engine's rule on config.json and the
    deployment's max_model_len); None when the gateway cannot read the model."""
    text = model_text(deployment.model)
    return served_context(text.max_context, deployment.max_model_len) if text is not None else None


def _prepare(deployment: Deployment, req: GenerationRequest) -> tuple[list[int] | None, int | None]:
    return prompt_ids(deployment, req), context_length(deployment)


async def tokenize(deployment: Deployment, req: GenerationRequest) -> None:
    """Put the prompt's ids in `req.prompt_token_ids` (left None when the gateway cannot read the
    model), and refuse a prompt that leaves no token to generate, as the engine would (400
    `context_length_exceeded`), before a replica is chosen."""
    ids, limit = await asyncio.to_thread(_prepare, deployment, req)
    if ids is None:
        return
    if limit is not None and len(ids) >= limit:
        # The engine's check_prompt; max_tokens past the room left is cut short there, not refused.
        param = _param(req, "prompt")
        raise GatewayError(
            400,
            f"This model's maximum context length is {limit} tokens; your {bare(param)} resulted "
            f"in {len(ids)} tokens, which leaves none to generate.",
            param,
            "context_length_exceeded",
        )
    req.prompt_token_ids = ids


def _param(req: GenerationRequest, param: str | None) -> str | None:
    """The engine names prompt problems `prompt`; a chat request's prompt is its `messages`."""
    return "messages" if req.kind == "chat" and param == "prompt" else param
