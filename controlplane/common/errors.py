"""Domain errors and the single place they become HTTP responses."""

from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError
from rest_framework import exceptions, status
from rest_framework.views import exception_handler as drf_exception_handler

from controlplane.common.json_body import too_large
from controlplane.common.parsers import as_api_exception


class DomainError(Exception):
    """A request that makes sense but cannot be carried out; `field` names the culprit."""

    status_code = status.HTTP_400_BAD_REQUEST

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class UnusableValue(exceptions.APIException):
    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "invalid"


def exception_handler(exc, context):
    if isinstance(exc, DomainError):
        detail = {exc.field: [exc.message]} if exc.field else {"detail": exc.message}
        response = drf_exception_handler(exceptions.ValidationError(detail), context)
        response.status_code = exc.status_code
        return response
    if isinstance(exc, RequestDataTooBig):  # Django's own limit (forms, request.body): the same 413
        return drf_exception_handler(as_api_exception(too_large()), context)
    if isinstance(exc, DataError):
        # A value no validator looked at that the database refuses (a NUL character in a lookup
        # through a slug field, a path or a query; a number past the column's range): the
        # caller's input, not a server failure.
        reason = (str(exc).strip().splitlines() or ["invalid value"])[0]
        return drf_exception_handler(
            UnusableValue(f"The request holds a value the database refuses: {reason}."), context
        )
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {"detail": exc.messages}
        return drf_exception_handler(exceptions.ValidationError(detail), context)
    return drf_exception_handler(exc, context)
