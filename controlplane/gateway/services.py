import secrets

from django.db import transaction
from django.utils import timezone

from controlplane.common.services import hash_secret
from controlplane.events.services import record_event
from controlplane.gateway.models import ApiKey

KEY_PREFIX = "sy-"


@transaction.atomic
def create_api_key(
    *,
    name: str,
    owner,
    allowed_deployments=(),
    rpm_limit=None,
    tpm_limit=None,
    weight=1.0,
    min_priority=0,
    actor=None,
) -> tuple[ApiKey, str]:
    """Returns the key and its secret; the secret is not stored and cannot be shown again."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        name=name,
        owner=owner,
        prefix=secret[:12],
        hashed_secret=hash_secret(secret),
        rpm_limit=rpm_limit,
        tpm_limit=tpm_limit,
        weight=weight,
        min_priority=min_priority,
    )
    key.allowed_deployments.set(allowed_deployments)
    record_event("api_key.created", key, actor=actor or owner)
    return key, secret


def revoke_api_key(key: ApiKey, actor=None) -> ApiKey:
    if not key.revoked:
        key.revoked, key.revoked_at = True, timezone.now()
        key.save(update_fields=["revoked", "revoked_at"])
        record_event("api_key.revoked", key, actor=actor)
    return key


def authenticate(secret: str) -> ApiKey | None:
    """The live key for a presented secret, or None."""
    if not secret or not secret.startswith(KEY_PREFIX):
        return None
    return ApiKey.objects.filter(hashed_secret=hash_secret(secret), revoked=False).select_related("owner").first()
