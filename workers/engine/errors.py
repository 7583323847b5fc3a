"""Errors the engine raises for bad input, each naming what is wrong."""


class EngineError(Exception):
    """Base class for errors a caller can act on."""


class ModelLoadError(EngineError):
    """A model directory is missing, broken, or of an unsupported architecture."""


class UnsupportedArchitectureError(ModelLoadError):
    pass


class RequestError(EngineError, ValueError):
    """A request cannot be served as given (too long, bad sampling parameters...)."""
