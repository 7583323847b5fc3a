"""Management API tokens: created with a secret shown once, kept as a sha256, revocable."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from django.utils import timezone

from controlplane.common.models import ManagementToken

TOKEN_PREFIX = "syt-"
PREFIX_LENGTH = 12
# last_used_at is a hint for operators, not an audit log: one write a minute at most per token.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_secret(secret: str) -> str:
    # The secret is 256 random bits, so a plain sha256 suffices (no slow password hash needed).
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(user, *, name: str = "") -> tuple[ManagementToken, str]:
    """The new token and its secret; the secret is not stored and cannot be shown again."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ManagementToken.objects.create(
        user=user, name=name, prefix=secret[:PREFIX_LENGTH], hashed_secret=hash_secret(secret)
    )
    return token, secret


def revoke_tokens(user, *, prefix: str | None = None, name: str | None = None) -> int:
    """Revoke the user's live tokens, or those of them starting with `prefix` or named `name`;
    returns how many."""
    tokens = ManagementToken.objects.filter(user=user, revoked_at__isnull=True)
    if prefix is not None:
        tokens = tokens.filter(prefix=prefix[:PREFIX_LENGTH])
    if name is not None:
        tokens = tokens.filter(name=name)
    return tokens.update(revoked_at=timezone.now())


def authenticate(secret: str) -> ManagementToken | None:
    """The live token for a presented secret, or None. Found by its public prefix, then the
    hashes compared in constant time."""
    if not secret.startswith(TOKEN_PREFIX) or len(secret) <= PREFIX_LENGTH:
        return None
    presented = hash_secret(secret)
    candidates = ManagementToken.objects.filter(prefix=secret[:PREFIX_LENGTH], revoked_at__isnull=True)
    match = None
    for token in candidates.select_related("user"):
        if hmac.compare_digest(token.hashed_secret, presented):
            match = token
    if match is not None:
        now = timezone.now()
        if match.last_used_at is None or now - match.last_used_at > LAST_USED_RESOLUTION:
            ManagementToken.objects.filter(pk=match.pk).update(last_used_at=now)
            match.last_used_at = now
    return match
