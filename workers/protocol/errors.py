"""The error both ends raise for a request that cannot be served as given.

The gateway tokenises prompts with the replica's own code (workers/protocol/tokenizer.py), so a
chat template's refusal is raised on either side; the engine re-exports this class as its
`RequestError`, so one `except` catches the template's refusals and the engine's alike.
"""

from __future__ import annotations


class RequestError(ValueError):
    """A request cannot be served as given (too long, bad sampling parameters, a conversation
    the chat template refuses...). `param` names the field at fault when there is one
    (`temperature`, `prompt`, `messages`...), so a server can tell its client what to fix."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param
