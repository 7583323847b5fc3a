"""Errors the engine raises for bad input, each naming what is wrong."""

from workers.model_files import ModelDirectoryError, UnsupportedArchitectureError


class EngineError(Exception):
    """Base class for errors a caller can act on while serving."""


# A model directory is missing, broken, or of an unsupported architecture. The directory
# checks live in the torch-free `workers.model_files` (the catalog shares them), so loading
# errors are that module's class under the engine's name.
ModelLoadError = ModelDirectoryError


class RequestError(EngineError, ValueError):
    """A request cannot be served as given (too long, bad sampling parameters...)."""


__all__ = ["EngineError", "ModelLoadError", "RequestError", "UnsupportedArchitectureError"]
