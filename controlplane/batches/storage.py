"""Where uploaded files' bytes live: one small interface, so that an object store can replace
the default, a directory under the state directory (`BATCH_FILES_DIR`). Only the web process
reads and writes it (uploads, validation, downloads): the dispatcher works from the database."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from django.conf import settings

CHUNK = 1 << 20
_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class FileStorage(Protocol):
    def save(self, file_id: str, chunks: Iterator[bytes]) -> int:
        """Store the bytes under `file_id`; returns how many."""

    def open(self, file_id: str) -> Iterator[bytes]:
        """The bytes, in chunks (FileNotFoundError if there are none)."""

    def delete(self, file_id: str) -> None:
        """Forget the bytes (nothing if there are none)."""


class LocalFileStorage:
    """Files in one directory, written to a temporary name and renamed, so a reader never sees
    half a file."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def _path(self, file_id: str) -> Path:
        if not _SAFE_ID.match(file_id):  # ids are ours, but a path is never built from anything else
            raise ValueError(f"not a file id: {file_id!r}")
        return self.root / file_id

    def save(self, file_id: str, chunks: Iterator[bytes]) -> int:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        path, size = self._path(file_id), 0
        tmp = path.with_suffix(".part")
        with open(tmp, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
                size += len(chunk)
        os.replace(tmp, path)
        return size

    def open(self, file_id: str) -> Iterator[bytes]:
        with open(self._path(file_id), "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk

    def delete(self, file_id: str) -> None:
        self._path(file_id).unlink(missing_ok=True)


def get_storage() -> FileStorage:
    return LocalFileStorage(Path(settings.BATCH_FILES_DIR))
