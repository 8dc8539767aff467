"""Writing a file whole: whether a directory takes files, and a new hidden temporary file in it
(to be linked or renamed to its name once written, so that no reader sees half a file)."""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path


def unwritable(directory: Path) -> str | None:
    """Why no file can be written into ``directory``, creating it if need be (one phrase for an
    error), or None.

    A file on the way (``directory`` or an ancestor) is named. Else it is tried, not guessed from
    permission bits (root passes every access check, ``/proc`` refuses anyway): a temporary file
    is created and removed in ``directory``, or, while it does not exist, in its nearest existing
    ancestor. Nothing else is created, so runs starting side by side never remove each other's
    directories."""
    blocking = next((p for p in (directory, *directory.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        return f"{str(blocking)!r} is a file"
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    try:
        tempfile.NamedTemporaryFile(dir=existing).close()
    except OSError as err:
        return f"{str(directory)!r} cannot be created or written ({err.strerror or err})"
    return None


def temporary_file(directory: Path, suffix: str, write) -> Path:
    """A new hidden file in ``directory`` holding what ``write(file)`` writes, created with the
    mode an ordinary new file gets (0666 less the umask; ``mkstemp`` would make it 0600)."""
    while True:
        tmp = directory / f".result-{secrets.token_hex(8)}{suffix}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp
