"""`Authorization: Bearer <token>` for the management API (DRF's token model, OAuth-style keyword)."""

from rest_framework.authentication import TokenAuthentication


class BearerTokenAuthentication(TokenAuthentication):
    keyword = "Bearer"
