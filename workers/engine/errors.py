"""Errors the engine raises for bad input, each naming what is wrong.

Both are the torch-free protocol's classes under the engine's names: the gateway raises them
too, from the tokenizer and the model-directory checks it shares with the engine
(workers/protocol/tokenizer.py, workers/protocol/model_files.py), so one `except` catches them
wherever they came from.
"""

import re

from workers.protocol.errors import RequestError
from workers.protocol.model_files import ModelDirectoryError, UnsupportedArchitectureError

# A model directory is missing, broken, or of an unsupported architecture.
ModelLoadError = ModelDirectoryError

__all__ = ["ModelLoadError", "RequestError", "UnsupportedArchitectureError", "describe", "first_line"]


_LOCATION = re.compile(r"^\[[\d:]+\] \S+?:\d+: ")  # xgrammar's "[hh:mm:ss] file.cc:123: " prefix


def first_line(exc: BaseException) -> str:
    """`exc`'s message, its first line, without the location prefix a C++ extension adds."""
    text = str(exc).strip()
    return _LOCATION.sub("", text.splitlines()[0]) if text else ""


def describe(exc: BaseException) -> str:
    """One line saying what `exc` was: its type and its message's first line."""
    first = first_line(exc)
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
