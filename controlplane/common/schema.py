"""The management API's OpenAPI schema: drf-spectacular's, with the error responses each
operation can really give, so that clients (and the schemathesis suite) can rely on them.

drf-spectacular documents success responses only. Every error here comes from DRF's exception
handler (common.errors) or the JSON 404 of an unknown path, all shaped `{"detail": "..."}`,
except a 400, which names the fields at fault (`{"field": ["message"]}`; a body that is not
JSON is `{"detail": ...}`).
"""

from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers
from rest_framework.permissions import SAFE_METHODS, AllowAny, IsAuthenticated

from controlplane.common.permissions import StaffWritesOrReadOnly

# Permissions under which a read is never a 403 (an anonymous caller is refused with a 401).
READS_OPEN = (AllowAny, IsAuthenticated, StaffWritesOrReadOnly)
BODY_METHODS = ("POST", "PUT", "PATCH")


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()

    class Meta:
        ref_name = "Error"


VALIDATION_ERROR = {
    "type": "object",
    "description": "Each field at fault with its messages (`non_field_errors` for the whole body); "
    "`detail` alone when the request as a whole is refused (a body that is not JSON, a value the database refuses).",
    "additionalProperties": {
        "oneOf": [
            {"type": "array", "items": {}},
            {"type": "object"},
            {"type": "string"},
        ]
    },
}


class AutoSchema(SpectacularAutoSchema):
    def _get_response_bodies(self, direction="response"):
        # The one place spectacular builds an operation's responses (no public hook adds codes
        # without replacing its choice of 200/201/204); explicit @extend_schema codes win.
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        for code, response in self._error_responses().items():
            if code not in responses:
                responses[code] = self._get_response_for_code(response, code, direction=direction)
        return responses

    def _error_responses(self) -> dict[str, OpenApiResponse]:
        def error(description: str) -> OpenApiResponse:
            return OpenApiResponse(ErrorSerializer, description=description)

        has_body = self.method in BODY_METHODS and self.get_request_serializer() is not None
        has_query = any(p["in"] == "query" for p in self._get_parameters())
        codes = {"401": error("No valid credentials (an invalid or revoked token is refused everywhere).")}
        if has_body or has_query:
            codes["400"] = OpenApiResponse(self._validation_error(), description="Invalid parameters or body.")
        if self.method not in SAFE_METHODS or not all(isinstance(p, READS_OPEN) for p in self.view.get_permissions()):
            codes["403"] = error("Not allowed: staff only, or a session request without its CSRF token.")
        if "{" in self.path or self._get_pagination_parameters():
            codes["404"] = error("No such object, or no such page.")
        if has_body:
            codes["413"] = error("The body is over MAX_REQUEST_BYTES.")
            codes["415"] = error("The body is not JSON, a form or multipart.")
        return codes

    def _validation_error(self) -> dict:
        component = ResolvedComponent(
            name="ValidationError", type=ResolvedComponent.SCHEMA, schema=VALIDATION_ERROR, object="ValidationError"
        )
        self.registry.register_on_missing(component)
        return component.ref
