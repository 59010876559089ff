"""Whether the WAL beside a SQLite file is still the one this process's connection writes through.

While a connection is open, SQLite's shared lock on the file keeps any other process from deleting
the WAL beside it. POSIX locks belong to the process, not the descriptor: closing ANY descriptor of
the file in this process (a tool that reads it, a backup, a checksum) drops them all. Another
process's last close then checkpoints and deletes the WAL, and this connection goes on committing
into the deleted one: commits nobody else sees, lost when this process ends while others have the
file open or when it is killed. The journal and the effect store both look before each commit.

They look without reading the WAL's timestamps (``identity``: ``statx`` asking for the inode number
alone). ``os.stat`` asks for every field; since Linux 6.13 (multigrain timestamps) a file whose ctime or
mtime was read gets a fine-grained new mtime at its next write, which dirties its inode, and ext4 then
writes the inode's block in the commit's ``fdatasync``: a third I/O round trip on top of the data and
the cache flush. Measured on this project's machine (ext4, a virtio disk): 3.0 sleeps per commit
against SQLite's own 2.0, about 50 µs more per commit, twice per step (docs/architecture.md, fourth pass).
"""

from __future__ import annotations

import ctypes
import os
import sqlite3
import sys
import time
from collections.abc import Callable

WalId = tuple[int, int]  # (st_dev, st_ino) of the -wal file

_STATX_INO = 0x100
# statx's arguments but the name and the buffer, as ctypes objects made once: a call without ``argtypes``
# passes them as they are (5.5k instructions a call, against 8.5k converting Python ints, 6.8k for os.stat)
_AT_FDCWD, _NO_FLAGS, _MASK = ctypes.c_int(-100), ctypes.c_int(0), ctypes.c_uint(_STATX_INO)


class _Statx(ctypes.Structure):
    """``struct statx`` (linux/stat.h, 256 bytes): the fields read here, the rest as padding."""

    _fields_ = (
        ("mask", ctypes.c_uint32),
        ("_head", ctypes.c_uint8 * 28),
        ("ino", ctypes.c_uint64),  # offset 32
        ("_middle", ctypes.c_uint8 * 88),
        ("rdev_major", ctypes.c_uint32),  # offset 128
        ("rdev_minor", ctypes.c_uint32),
        ("dev_major", ctypes.c_uint32),  # always filled, whatever the mask
        ("dev_minor", ctypes.c_uint32),
        ("_tail", ctypes.c_uint8 * 112),
    )


def _load_statx() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        # CDLL, not PyDLL: the call drops the GIL (two mutex round trips per commit) because a journal on a
        # network file system can block in stat, and the process's other threads (an owner's lease renewal, the
        # event loop) must go on meanwhile
        call = ctypes.CDLL(None).statx  # glibc >= 2.28
    except (OSError, AttributeError):
        return None
    call.restype = ctypes.c_int  # (no argtypes: every argument is passed as a ctypes object, above)
    return call


class _Use:
    """``statx`` while it works here; ``None`` once it is missing or refused (``os.stat`` from then on)."""

    statx = _load_statx()


def identity(path: str) -> WalId | None:
    """``(st_dev, st_ino)`` of the file ``path`` names (symlinks followed), ``None`` if there is none, as
    ``os.stat`` gives them, without asking for its timestamps (see above). Where ``statx`` is missing or
    refused (another OS, an old libc, a sandbox that filters it) this is ``os.stat``."""
    return _identity(path, os.fsencode(path))


def _identity(path: str, encoded: bytes) -> WalId | None:
    call = _Use.statx
    if call is not None and b"\0" not in encoded:
        buf = _Statx()  # one per call: nothing shared between threads
        if (
            call(_AT_FDCWD, ctypes.c_char_p(encoded), _NO_FLAGS, _MASK, ctypes.byref(buf)) == 0
            and buf.mask & _STATX_INO
        ):
            return os.makedev(buf.dev_major, buf.dev_minor), buf.ino
        # Failed (no such file, or statx itself refused): os.stat tells which, and gives the answer.
    try:
        st = os.stat(path)
    except OSError:
        return None
    if call is not None and b"\0" not in encoded:
        buf = _Statx()  # (asked again: the file may have appeared between the two looks)
        if (
            call(_AT_FDCWD, ctypes.c_char_p(encoded), _NO_FLAGS, _MASK, ctypes.byref(buf)) != 0
            or not buf.mask & _STATX_INO
        ):
            _Use.statx = None  # statx fails where stat answers (a sandbox filters it, say): os.stat from now on
    return st.st_dev, st.st_ino


class _NameWatch:
    """One sidecar file beside a SQLite file as this connection first saw it (``lost()`` before each commit)."""

    __slots__ = ("_buf", "_encoded", "_name", "_parts", "_path", "_ref", "_seen")

    def __init__(self, path: str) -> None:
        self._path = path
        encoded = os.fsencode(path)
        # b"" (statx fails, os.stat decides) for a name with a NUL, which statx would read as a shorter name
        self._encoded = encoded if b"\0" not in encoded else b""
        self._name = ctypes.c_char_p(self._encoded)  # (holds the bytes it points to)
        # The buffer ``lost(in_turn=True)`` answers in, with its pointer: made once (a buffer and a ``byref``
        # cost ~2k instructions, before every commit).
        self._buf = _Statx()
        self._ref = ctypes.byref(self._buf)
        self._see(_identity(path, encoded))

    def _see(self, seen: WalId | None) -> None:
        self._seen = seen
        # The same identity as statx gives it (inode, device major, minor), for ``lost`` to compare field by
        # field: no ``os.makedev`` and no tuple per commit. ``None`` while no file was seen.
        self._parts = (seen[1], os.major(seen[0]), os.minor(seen[0])) if seen is not None else None

    def lost(self, in_turn: bool = False) -> bool:
        """Whether the file was removed or replaced since it was first seen. No file yet when first looked
        at: the first one that appears is this connection's.

        ``in_turn``: the caller asks only while it holds a lock that no other thread asking this watch
        holds at once (the journal asks inside its writers' gate, ``filelocks.SharedFile.enter``), so the
        watch's own buffer is used; otherwise a buffer per call (the call drops the GIL: two threads
        asking at once would each read what the other's call wrote)."""
        parts = self._parts
        # (``_identity``, inline: this runs before every commit) not os.stat: it would cost the commit's
        # sync an inode write (above)
        call = _Use.statx
        if in_turn:
            buf, ref = self._buf, self._ref
        else:
            buf = _Statx()
            ref = ctypes.byref(buf)
        if call is not None and call(_AT_FDCWD, self._name, _NO_FLAGS, _MASK, ref) == 0 and buf.mask & _STATX_INO:
            if parts is not None:  # (st_dev, st_ino) compared as their parts: the same answer as ``now != seen``
                return not (buf.ino == parts[0] and buf.dev_major == parts[1] and buf.dev_minor == parts[2])
            now: WalId | None = (os.makedev(buf.dev_major, buf.dev_minor), buf.ino)
        else:
            now = _identity(self._path, self._encoded)  # gone, or statx refused, or a NUL in the name
        seen = self._seen
        if now is None:
            return seen is not None  # gone (a file first seen missing is not this connection's yet)
        if seen is None:
            self._see(now)
            return False
        return now != seen

    def foreign(self) -> bool:
        """Whether another file than the one first seen is at the name now (another process made it)."""
        seen, now = self._seen, _identity(self._path, self._encoded)
        return seen is not None and now is not None and now != seen


class WalWatch:
    """The WAL and the shared-memory index beside ``path`` as this connection first saw them; ``lost()``
    before each commit.

    The ``-shm`` file is where every process's SQLite finds how far the WAL goes. Removed while this
    connection has it mapped (a clean-up's ``rm -f *.db-shm``, by a tool in this very process), the next
    process to open the file makes a new one, rebuilt from the WAL, and from then on the two index the
    WAL apart: this connection's next commit lands where its own index says the WAL ends, over the other
    process's commits (a whole run, acknowledged, gone; ``verify`` ok for what was left). So a ``-shm``
    that is gone or another file refuses every later commit too. Looking before the commit is enough:
    a process that opens the file after that look either finds this connection's index (and sees its
    commit) or makes a new one only once the name is gone, which the next look sees."""

    __slots__ = ("_shm", "_wal")

    def __init__(self, path: str) -> None:
        self._wal = _NameWatch(path + "-wal")
        self._shm = _NameWatch(path + "-shm")

    def lost(self, in_turn: bool = False) -> bool:
        """Whether the WAL or the shared-memory index was removed or replaced since first seen (then
        nothing more may be committed through this connection); ``in_turn`` as ``_NameWatch.lost``."""
        return self._wal.lost(in_turn) or self._shm.lost(in_turn)

    def foreign(self) -> bool:
        """Whether another process made a WAL or shared-memory index of its own at either name since this
        connection first saw them: then this connection's view of the WAL is not the file's, and SQLite's
        checkpoint when it closes would write that view into the database file and delete the WAL with
        the other process's commits in it (``filelocks.pin_no_checkpoint``). While only gone, no process
        has opened the file since (any would have made both), and that checkpoint keeps what this
        connection committed into the removed WAL."""
        return self._wal.foreign() or self._shm.foreign()


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
