"""The management API's JSON parser: DRF's, within the request limits (see json_body)."""

from django.conf import settings
from rest_framework import exceptions, parsers, status

from controlplane.common import json_body


class RequestTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "request_too_large"


class JSONParser(parsers.JSONParser):
    """A body over MAX_REQUEST_BYTES is a 413 (read no further than the limit); one nested
    deeper than MAX_JSON_DEPTH, or holding NaN or Infinity, a 400 naming the field."""

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read(settings.MAX_REQUEST_BYTES + 1)
        if len(raw) > settings.MAX_REQUEST_BYTES:
            raise as_api_exception(json_body.too_large())
        encoding = parsers.get_encoding(parser_context or {})
        try:
            text = raw.decode(encoding)
        except (UnicodeDecodeError, LookupError):
            raise exceptions.ParseError(f"JSON parse error - the body is not {encoding} text.") from None
        try:
            return json_body.load(text)
        except json_body.BodyError as exc:
            raise as_api_exception(exc) from None


def as_api_exception(exc: json_body.BodyError) -> exceptions.APIException:
    """The DRF error for a refused body: 413, a field error when a field is named, else a parse error."""
    if exc.status == 413:
        return RequestTooLarge(exc.message)
    if exc.param:
        return exceptions.ValidationError({exc.param: [exc.message]})
    return exceptions.ParseError(f"JSON parse error - {exc.message}")
