"""How the dispatcher authenticates a batch's lines to the gateway: a bearer token naming the
batch, signed with the SECRET_KEY the web and control processes share. The gateway serves the
line as the batch's API key (its owner, its allowed deployments), at the batch priority, without
the key's per-minute limits (a batch is paced by the dispatcher instead)."""

from __future__ import annotations

import hashlib
import hmac

from django.conf import settings

PREFIX = "sy-batch-"


def _signature(batch_id: str) -> str:
    return hmac.new(settings.SECRET_KEY.encode(), f"batch:{batch_id}".encode(), hashlib.sha256).hexdigest()


def token_for(batch_id: str) -> str:
    return f"{PREFIX}{batch_id}.{_signature(batch_id)}"


def batch_id_of(secret: str) -> str | None:
    """The batch a token was signed for, or None (not a batch token, or a forged one)."""
    if not secret.startswith(PREFIX):
        return None
    batch_id, _, signature = secret[len(PREFIX) :].partition(".")
    if not batch_id or not hmac.compare_digest(signature, _signature(batch_id)):
        return None
    return batch_id
