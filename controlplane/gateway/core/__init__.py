"""What every API dialect of the gateway shares: the validated request, the error, the JSON body,
the checks and the token counts. A dialect (dialects/) parses its own shape into these and renders
them back; nothing here knows any dialect's wire format. Import from here; `checks` is the module
of validators."""

from controlplane.gateway.core import checks
from controlplane.gateway.core.body import parse_json, read_json, too_large
from controlplane.gateway.core.errors import GatewayError, OpenAIError, bad, show
from controlplane.gateway.core.names import Names, bare, naming, ref
from controlplane.gateway.core.request import GenerationRequest
from controlplane.gateway.core.usage import TokenCounts, counts

__all__ = [
    "GatewayError", "GenerationRequest", "Names", "OpenAIError", "TokenCounts", "bad", "bare", "checks", "counts",
    "naming", "parse_json", "read_json", "ref", "show", "too_large",
]  # fmt: skip
