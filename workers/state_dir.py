"""The state directory (SQLite database, secret key, logs, run.json, replica specs) is private
to the user running Switchyard: directories 0700, files 0600.

Every process that writes there calls `make_private` first (settings import does, so the web
server, Celery, the node agent and `manage.py` do; `scripts/run.py` does before it starts any of
them). It sets the process umask, which the processes they start inherit (replicas write their
logs through it), and repairs the modes of a directory created by an older version.
No Django here: the replica side may import it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077


def make_private(state_dir: str | Path) -> Path:
    """Create `state_dir` (and its `logs/`) owner-only, set the umask so that what this process
    and its children create is too, and take group and other access off what is already there."""
    os.umask(PRIVATE_UMASK)
    root = Path(state_dir)
    logs = root / "logs"
    logs.mkdir(mode=0o700, parents=True, exist_ok=True)
    for directory in (root, logs):
        _owner_only(directory)
        for entry in directory.iterdir():
            if entry.is_file() and not entry.is_symlink():
                _owner_only(entry)
    return root


def _owner_only(path: Path) -> None:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return  # removed meanwhile by another process
    mode = stat.S_IMODE(info.st_mode)
    # Another user's file cannot be chmod-ed by us; leave it rather than fail at start-up.
    if mode & 0o077 and info.st_uid == os.getuid():
        path.chmod(mode & 0o700)
