"""The gateway's one error: a status, a message and the parameter at fault.

Raised anywhere from parsing to a replica's refusal; the dialect serving the request renders it
(`body()` is OpenAI's shape, which /v1 and vLLM's paths answer in; Anthropic renders its own).
`param` is named as the active dialect names it (names.py), so a client always reads the name
of what it sent.
"""

from __future__ import annotations

import json

from controlplane.gateway.core.names import current


class GatewayError(Exception):
    TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
             404: "not_found_error", 429: "rate_limit_error", 503: "service_unavailable"}  # fmt: skip

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None, headers=None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = current().param(param)
        self.code = code
        self.headers = headers or {}

    @property
    def type(self) -> str:
        return self.TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")

    def body(self) -> dict:
        """OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


OpenAIError = GatewayError  # the name tests and the web server's own views know it by


def bad(message: str, param: str | None = None, code: str = "invalid_value") -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def show(value) -> str:
    """A value for an error message, short (an int past 4300 digits cannot even be str'd)."""
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else "an array"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"a {value.bit_length()}-bit integer"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
