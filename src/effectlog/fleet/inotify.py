"""Linux inotify through ctypes on libc: a thread sleeps in the kernel until a file changes.

Used by the SQLite store's wake-up watcher (``effectlog.fleet.wakeups``): a commit by
any process writes the store's ``-wal`` file (or, at a checkpoint, the store file), and
the kernel reports that write to every watch on the file's directory. The directory is
watched, not the files, because SQLite creates the WAL on first write, deletes it when
the last connection closes and rewrites it from the start after a checkpoint: a watch
on the directory sees the WAL under its name whatever happened to the inode before.

Only the standard library and libc: ``inotify_init1`` and ``inotify_add_watch`` by
ctypes, the events read with ``os.read``. Elsewhere (no Linux, no libc symbol, a
descriptor limit reached) ``Inotify.open`` returns ``None`` and the caller polls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import sys

IN_MODIFY = 0x0002
IN_CLOSE_WRITE = 0x0008
IN_MOVED_TO = 0x0080
IN_CREATE = 0x0100
IN_DELETE_SELF = 0x0400
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
# What a commit, a checkpoint, a WAL reset or truncation, or a WAL recreated or renamed into place does.
CHANGED = IN_MODIFY | IN_CLOSE_WRITE | IN_CREATE | IN_MOVED_TO
# The watch ended: the directory was deleted, or its file system unmounted. (A watch follows the
# directory's inode: renamed, it goes on reporting its files.)
GONE = IN_DELETE_SELF | IN_IGNORED
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name
_READ = 64 * 1024


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError):
        return None
    return libc


class Changes:
    """What one read of the queue saw: the names changed, and whether the watch can still see anything."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.overflowed = False  # the kernel's queue was full and dropped events: any file may have changed
        self.lost = False  # the watch ended (directory deleted, file system unmounted): it sees nothing more

    def written(self, name: str) -> bool:
        """Whether ``name`` may have been written (it was, or the queue overflowed and nobody knows)."""
        return self.overflowed or name in self.names


class Inotify:
    """One inotify descriptor watching one directory for written, created or renamed-in files."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def open(cls, directory: str) -> Inotify | None:
        """A watch on ``directory``, or ``None`` where inotify is not available (the caller polls instead)."""
        libc = _libc()
        if libc is None:
            return None
        fd = int(libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
        if fd < 0:
            return None
        if int(libc.inotify_add_watch(fd, os.fsencode(directory), CHANGED | IN_DELETE_SELF)) < 0:
            os.close(fd)
            return None
        return cls(fd)

    def wait(self, also: int) -> bool:
        """Sleep until an event is queued (True) or ``also`` becomes readable (False)."""
        poller = select.poll()  # not select(): descriptors above 1023 are fine
        poller.register(self.fd, select.POLLIN)
        poller.register(also, select.POLLIN)
        return also not in {fd for fd, _ in poller.poll()}

    def read(self) -> Changes:
        """Every event queued now (non-blocking), by file name."""
        seen = Changes()
        while True:
            try:
                data = os.read(self.fd, _READ)
            except BlockingIOError:
                return seen
            at = 0
            while at + _EVENT.size <= len(data):
                _, mask, _, length = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size : at + _EVENT.size + length].rstrip(b"\0")
                at += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:
                    seen.overflowed = True
                if mask & GONE and not name:
                    seen.lost = True
                if name:
                    seen.names.add(os.fsdecode(name))

    def close(self) -> None:
        os.close(self.fd)
