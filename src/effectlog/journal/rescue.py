"""A SQLite file (the journal, the effect store) that no name leads to any more, saved while this process
still has it open.

A tool that removes the journal (``rm -f j.db*``) or renames a copy over it (a "compaction") during
its call leaves the journal's history, the request of the step in flight among it, in a file only
this process's descriptors reach: gone when it ends. A run started again at the name would find no
request and send the step again. So, before it refuses to write more, the process copies what it
sees of the file (SQLite's online backup, through its own connection: the database file and its WAL
as one) to a new file beside the name, and puts it back at the name when nothing is there (no file,
no ``-wal``, no ``-shm``): the next run then finds the step requested (uncertain, or resent under its
key). Where another file is at the name, that file is left as it is and the message names the copy.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3

from effectlog.journal import filelocks


def orphaned(fd: int) -> bool:
    """Whether the file open at ``fd`` has no name left (removed, or replaced by a rename)."""
    try:
        return os.fstat(fd).st_nlink == 0
    except OSError:
        return False


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _new_name(path: str) -> str:
    """A name beside ``path`` that nothing holds, made now as an empty 0600 file."""
    base, n = f"{path}.rescued-{os.getpid()}", 0
    while True:
        name = base if n == 0 else f"{base}-{n}"
        if not any(os.path.lexists(name + suffix) for suffix in ("", *filelocks.SIDECARS)) and filelocks.create_empty(
            name
        ):
            os.chmod(name, 0o600)  # whatever the umask (G8)
            return name
        n += 1


def save(db: sqlite3.Connection, path: str) -> tuple[str, bool]:
    """Copy the database ``db`` is open on beside ``path`` (its name when opened); put the copy back at
    ``path`` when nothing is there. Returns where the copy is and whether it is at ``path``; ``OSError``
    or ``sqlite3.Error`` when it could not be saved."""
    name = _new_name(path)
    out = sqlite3.connect(name, isolation_level=None)
    try:
        out.execute("PRAGMA synchronous = FULL")
        db.backup(out)
    finally:
        out.close()
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if not any(os.path.lexists(path + suffix) for suffix in ("", *filelocks.SIDECARS)):
        try:
            os.link(name, path)  # never over a file that appeared meanwhile
        except FileExistsError:
            _fsync_dir(path)
            return name, False
        os.unlink(name)
        _fsync_dir(path)
        return path, True
    _fsync_dir(path)
    return name, False
