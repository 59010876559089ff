"""Whether the WAL beside a SQLite file is still the one this process's connection writes through.

While a connection is open, SQLite's shared lock on the file keeps any other process from deleting
the WAL beside it. POSIX locks belong to the process, not the descriptor: closing ANY descriptor of
the file in this process (a tool that reads it, a backup, a checksum) drops them all. Another
process's last close then checkpoints and deletes the WAL, and this connection goes on committing
into the deleted one: commits nobody else sees, lost when this process ends while others have the
file open or when it is killed. The journal and the effect store both look before each commit.
"""

from __future__ import annotations

import os
import sqlite3
import time

WalId = tuple[int, int]  # (st_dev, st_ino) of the -wal file


def _identity(wal: str) -> WalId | None:
    try:
        st = os.stat(wal)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class WalWatch:
    """The WAL file beside ``path`` as this connection first saw it; ``lost()`` before each commit."""

    __slots__ = ("_seen", "_wal")

    def __init__(self, path: str) -> None:
        self._wal = path + "-wal"
        self._seen = _identity(self._wal)

    def lost(self) -> bool:
        """Whether the WAL was removed or replaced since it was first seen (then nothing more may be
        committed through this connection). No WAL yet when first looked at: the first one that
        appears is this connection's."""
        seen = self._seen
        try:  # (``_identity``, inline: this runs before every commit)
            st = os.stat(self._wal)
        except OSError:
            return seen is not None  # gone (a WAL first seen missing is not this connection's yet)
        if seen is None:
            self._seen = st.st_dev, st.st_ino
            return False
        return st.st_ino != seen[1] or st.st_dev != seen[0]


def switch_to_wal(db: sqlite3.Connection, timeout_s: float) -> str:
    """``PRAGMA journal_mode = WAL`` on ``db``, waiting up to ``timeout_s`` for another connection that
    holds the file's write lock; returns the mode SQLite reports.

    Switching a file to WAL reads its header under a read lock, then asks for the write lock. When
    another connection holds it (two processes opening one new file, each switching it), SQLite
    answers ``SQLITE_BUSY`` at once without calling the busy handler: a reader waiting for a writer
    that may be waiting for it would deadlock. The statement holds no lock once it fails, so it is
    tried again after a short sleep, as the busy handler would have, until the timeout."""
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while True:
        try:
            return str(db.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorname != "SQLITE_BUSY" or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
