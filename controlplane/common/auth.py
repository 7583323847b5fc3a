"""`Authorization: Bearer <token>` for the management API, checked against `ManagementToken`."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header

from controlplane.common import services

KEYWORD = b"bearer"


class BearerTokenAuthentication(BaseAuthentication):
    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != KEYWORD:
            return None  # another scheme, or none: let the next authenticator try
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Invalid Authorization header: expected `Bearer <token>`.")
        try:
            secret = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid token.") from None
        token = services.authenticate(secret)
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid token.")
        return token.user, token

    def authenticate_header(self, request) -> str:
        return "Bearer"


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """The scheme in the OpenAPI schema (drf-spectacular finds it by `target_class`)."""

    target_class = BearerTokenAuthentication
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return build_bearer_security_scheme_object(header_name="Authorization", token_prefix="Bearer")
