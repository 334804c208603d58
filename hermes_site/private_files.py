"""Files only the owner may read, created so from the first byte.

`write_text()` then `chmod()` leaves a moment in which the file exists with
the umask's permissions (usually world-readable): these open it with mode
0600 in the same call that creates it.
"""

import os
from pathlib import Path
from typing import IO

PRIVATE_MODE = 0o600


def create_private(path: str | os.PathLike, *, encoding: str = "utf-8") -> IO[str]:
    """A new file (FileExistsError if one is there), open for text writing, 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
    return os.fdopen(fd, "w", encoding=encoding)


def ensure_private(path: str | os.PathLike) -> None:
    """Create an empty 0600 file unless one exists (a database SQLite then fills).

    SQLite gives its -wal and -shm files the database file's permissions.
    """
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE))
    except FileExistsError:
        pass


def private_dir(path: Path) -> Path:
    """A directory for local state, 0700 when this call creates it."""
    path.mkdir(mode=0o700, exist_ok=True)
    return path
