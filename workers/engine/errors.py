"""Errors the engine raises for bad input, each naming what is wrong."""

from workers.protocol.model_files import ModelDirectoryError, UnsupportedArchitectureError


class EngineError(Exception):
    """Base class for errors a caller can act on while serving."""


# A model directory is missing, broken, or of an unsupported architecture. The directory
# checks live in the torch-free `workers.protocol.model_files` (the catalog shares them), so loading
# errors are that module's class under the engine's name.
ModelLoadError = ModelDirectoryError


class RequestError(EngineError, ValueError):
    """A request cannot be served as given (too long, bad sampling parameters...). `param`
    names the field at fault when there is one (`temperature`, `prompt`...), so a server can
    tell its client which parameter to fix."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


__all__ = ["EngineError", "ModelLoadError", "RequestError", "UnsupportedArchitectureError"]
