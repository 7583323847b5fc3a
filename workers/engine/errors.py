"""Errors the engine raises for bad input, each naming what is wrong.

Both are the torch-free protocol's classes under the engine's names: the gateway raises them
too, from the tokenizer and the model-directory checks it shares with the engine
(workers/protocol/tokenizer.py, workers/protocol/model_files.py), so one `except` catches them
wherever they came from.
"""

from workers.protocol.errors import RequestError
from workers.protocol.model_files import ModelDirectoryError, UnsupportedArchitectureError

# A model directory is missing, broken, or of an unsupported architecture.
ModelLoadError = ModelDirectoryError

__all__ = ["ModelLoadError", "RequestError", "UnsupportedArchitectureError"]
