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
