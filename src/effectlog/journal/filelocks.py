"""Per-run OS locks on a SQLite journal file, shared by every journal object of a process.

One byte of the database file per run (an offset derived from the run id, far below
the bytes SQLite itself locks at 1 GiB) carries an open-file-description lock
(``F_OFD_SETLK``): exclusive between processes, released by the kernel when the holder
dies, and bound to the file's inode, so every path that reaches the file (symlink,
hard link, ``./``, ``..``) meets the same lock.

Two rules of POSIX locks shape this module:

- Closing *any* descriptor of a file drops every classic POSIX lock the process holds
  on it, SQLite's own included. So a process opens the journal file once, keeps that
  descriptor while any journal object uses the file, and closes it only after the
  last one has closed its SQLite connection (reference counted per inode).
- OFD locks taken through one shared descriptor do not exclude each other, so two
  claims of one run inside one process are told apart here, in ``held``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import sqlite3
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from effectlog.errors import FileInUse, JournalAliased, JournalInherited, JournalLocked

# 256 MiB .. 384 MiB: far from SQLite's lock bytes (PENDING_BYTE is at 1 GiB), and a
# range wide enough (2**27 slots) that two run ids sharing a byte is a curiosity.
SLOT_BASE = 0x1000_0000
SLOT_SPAN = 0x0800_0000

# The writers' gate, one byte below the runs' range: writers of the file take turns here
# before ``BEGIN IMMEDIATE``. SQLite's own lock still protects the data; its busy handler
# sleeps up to 100 ms between tries, so under contention a free database would sit idle.
GATE = SLOT_BASE - 1
# Every journal object of every process holds a shared lock here while it has the file open.
# Earlier versions told aliases apart by it (another process holds IN_USE and nobody our name's
# byte); it is still held so that their check sees processes of this version.
IN_USE = SLOT_BASE - 2
# The gate's lobby: of the processes waiting for the gate, the one holding this byte (the head)
# polls the gate; the others poll this byte, and less often (see ``SharedFile._wait_gate``).
LOBBY = SLOT_BASE - 3
# Each open also holds a shared lock on one byte for the *name* it opened the file by: a lock
# held by another open file description on any other byte of this range is another name in use.
NAME_BASE = 0x0F00_0000
NAME_SPAN = 0x0010_0000

# Bytes of the *-wal* file (far past any WAL's size; SQLite takes no locks on it): each process holds a
# shared lock on the byte of the database file (its device and inode) it uses the WAL for. A lock on any
# other byte is another database file at this name: the file was replaced by a rename while a process had
# it open, and SQLite would read and write that file's WAL as this one's (``_mark_wal``).
WAL_MARK_BASE = 1 << 40
WAL_MARK_SPAN = 1 << 20

# SQLite's own first SHARED byte (unix VFS, default PENDING_BYTE 0x40000000): its EXCLUSIVE lock on a
# database file is a write lock over the SHARED range, which a read lock on this byte refuses, an OFD
# lock refusing this very process's POSIX locks too (``pin_no_checkpoint``).
SQLITE_SHARED_FIRST = 0x4000_0002

_FLOCK = "hhqqi4x"  # struct flock on Linux: type, whence, start, len, pid (0 for OFD locks)


def slot(run_id: str) -> int:
    digest = hashlib.blake2b(run_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return SLOT_BASE + int.from_bytes(digest, "big") % SLOT_SPAN


def name_slot(path: str) -> int:
    digest = hashlib.blake2b(path.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return NAME_BASE + int.from_bytes(digest, "big") % NAME_SPAN


# The gate's two requests, packed once: they are made around every commit.
_GATE_WRLCK = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, GATE, 1, 0)
_GATE_UNLCK = struct.pack(_FLOCK, fcntl.F_UNLCK, os.SEEK_SET, GATE, 1, 0)
_LOBBY_WRLCK = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, LOBBY, 1, 0)
_LOBBY_UNLCK = struct.pack(_FLOCK, fcntl.F_UNLCK, os.SEEK_SET, LOBBY, 1, 0)
# How often a waiter tries again: the head polls the gate from 0.2 ms backing off to 2 ms, a
# follower the lobby from 0.2 ms to 10 ms (each try is a wake-up, a syscall and a Python exception).
_GATE_POLL_S, _GATE_POLL_MAX_S, _LOBBY_POLL_MAX_S = 0.0002, 0.002, 0.01


def _take(fd: int, packed: bytes) -> bool:
    """One try at a packed OFD lock request; False while another process holds the byte."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, packed)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True


def _ofd(fd: int, command: int, lock_type: int, start: int, length: int = 1) -> int:
    packed = fcntl.fcntl(fd, command, struct.pack(_FLOCK, lock_type, os.SEEK_SET, start, length, 0))
    return int(struct.unpack(_FLOCK, packed)[0])


class SharedFile:
    """This process's one descriptor of a journal file, and the runs it holds."""

    def __init__(self, key: tuple[int, int], fd: int, *, writable: bool) -> None:
        self.key = key
        self.fd = fd
        self.writable = writable
        self.refs = 0
        self.held: dict[str, int] = {}  # run id -> id() of the owner's claim that holds it
        self.passing: dict[str, int] = {}  # run id -> one-shot writers of this process inside a transaction
        self.names: set[str] = set()  # the names this process opened the file by (each holds its byte)
        self.turn = threading.Lock()  # this process's writers of the file (OFD locks of one descriptor do not exclude)
        self.inherited = False  # in a child of fork(): the parent's description, not this one's (_forget_inherited)
        self.wal_fd = -1  # the -wal file's descriptor holding this file's mark (``_mark_wal``), -1 if none
        self.wal_key: tuple[int, int] | None = None  # that -wal file's (st_dev, st_ino)
        self.lost = False  # something else closed ``fd`` (``descriptors_closed``): no lock is asked through it

    @contextmanager
    def gate(self, where: str, timeout_s: float) -> Iterator[None]:
        """Wait for this file's writers' turn: this process's first, then the other processes'."""
        self.enter(where, timeout_s)
        try:
            yield
        finally:
            self.leave()

    def enter(self, where: str, timeout_s: float) -> None:
        """``gate`` as a plain call, for the append path (one commit each): pair with ``leave``.

        A generator-based context manager costs several Python frames per commit; the
        locks taken are the same: this process's turn, then the writers' byte (OFD).
        """
        if self.inherited:
            raise self._inherited(where)
        turn = self.turn
        if not turn.acquire(False) and not turn.acquire(timeout=timeout_s):
            raise JournalLocked(f"{where}: another writer of this process kept the journal for {timeout_s:g}s")
        try:
            try:
                fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, _GATE_WRLCK)  # the uncontended case: one call
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                self._wait_gate(where, timeout_s)
        except BaseException:
            turn.release()
            raise

    @staticmethod
    def _inherited(where: str) -> JournalInherited:
        return JournalInherited(f"{where}: {INHERITED_ADVICE}; nothing was written")

    def _wait_gate(self, where: str, timeout_s: float) -> None:
        """Wait for the gate byte, at most ``timeout_s``: one waiting process polls it, the others the lobby.

        Every waiter polling the gate (8 processes: about one failed try per claim, each a
        wake-up that can preempt the holder) cost CPU on every core and, when a poll landed
        between a holder's commits, a hand-off to a process whose SQLite page cache is stale.
        So only the lobby's head polls the gate, as before; followers poll the lobby, backing
        off further, and whoever takes the gate gives the lobby up. The lobby only rations the
        polling: the gate byte is still what is taken, and every waiter still gives up at its
        own deadline, with the same error.
        """
        deadline = time.monotonic() + timeout_s
        pause, head = _GATE_POLL_S, False
        try:
            while True:
                if time.monotonic() > deadline:
                    raise JournalLocked(f"{where}: another process kept the journal's write lock for {timeout_s:g}s")
                time.sleep(pause)
                if not head:
                    head = _take(self.fd, _LOBBY_WRLCK)
                    if not head:
                        pause = min(pause * 2, _LOBBY_POLL_MAX_S)
                        # At the lobby's slowest pace a follower tries the gate too: a head that is stopped
                        # (SIGSTOP, a debugger, a frozen container) keeps the lobby and polls nothing, and
                        # the others waited out their timeouts over a free gate. A live head polls 5x as often.
                        if pause < _LOBBY_POLL_MAX_S or not _take(self.fd, _GATE_WRLCK):
                            continue
                        return
                    pause = _GATE_POLL_S
                if _take(self.fd, _GATE_WRLCK):
                    return
                pause = min(pause * 2, _GATE_POLL_MAX_S)
        finally:
            if head:
                fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, _LOBBY_UNLCK)

    def leave(self) -> None:
        """Give the writers' turn up (after ``enter``): the byte first, then this process's turn."""
        try:
            fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, _GATE_UNLCK)
        finally:
            self.turn.release()

    def try_lock(self, run_id: str, holder: int) -> bool:
        """Take the run's lock for an owner (exclusive); False while another owner or a one-shot writer has it."""
        if self.inherited:
            raise self._inherited("the journal")
        with _registry_lock:
            if run_id in self.held or self.passing.get(run_id):
                return False
            if not self._set(fcntl.F_WRLCK, run_id):
                return False
            self.held[run_id] = holder
            return True

    def try_pass(self, run_id: str) -> bool:
        """Take the run's lock shared, for one transaction of a writer that is not its owner (an operator).

        Shared, so writers passing through never refuse each other (their transactions queue at
        the gate); only a live owner's exclusive lock refuses them.
        """
        if self.inherited:
            raise self._inherited("the journal")
        with _registry_lock:
            if run_id in self.held:
                return False
            if not self.passing.get(run_id) and not self._set(fcntl.F_RDLCK, run_id):
                return False
            self.passing[run_id] = self.passing.get(run_id, 0) + 1
            return True

    def end_pass(self, run_id: str) -> None:
        with _registry_lock:
            left = self.passing.get(run_id, 0) - 1
            if left > 0:
                self.passing[run_id] = left
                return
            self.passing.pop(run_id, None)
            self._release_slot(run_id)

    def unlock(self, run_id: str, holder: int) -> None:
        with _registry_lock:
            if self.held.get(run_id) != holder:
                return
            del self.held[run_id]
            self._release_slot(run_id)

    def _set(self, lock_type: int, run_id: str) -> bool:
        try:
            _ofd(self.fd, fcntl.F_OFD_SETLK, lock_type, slot(run_id))
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True

    def _release_slot(self, run_id: str) -> None:
        if self.inherited:
            return  # the parent's lock on the shared description: closing a journal in the child keeps it
        if self.lost:
            return  # its description was closed, and its locks with it; the number may be another file's
        byte = slot(run_id)
        if any(slot(other) == byte for other in [*self.held, *self.passing]):
            return  # another run of this process shares the byte: keep it locked
        _ofd(self.fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, byte)

    def other_name(self, path: str) -> str | None:
        """Another name this file is open by, here or in another process (``None`` if only ``path``).

        SQLite keeps a database's WAL beside the name it was opened by; two names in use at
        once (a hard link, a bind mount, a rename while open) would be two WALs over one file.
        """
        with _registry_lock:
            if self.names - {path}:
                return sorted(self.names - {path})[0]
            # Any name's byte but this one's, held by another open file description: another name is
            # in use at this instant. One probe per side of our byte, each a single look at the
            # file's locks: a question of two probes (is IN_USE held? is our name's byte held?) was
            # answered wrongly whenever a process of our own name closed between them.
            mine = name_slot(path)
            for start, end in ((NAME_BASE, mine), (mine + 1, NAME_BASE + NAME_SPAN)):
                if end > start and _ofd(self.fd, fcntl.F_OFD_GETLK, fcntl.F_WRLCK, start, end - start) != fcntl.F_UNLCK:
                    return "a name another process uses"
            return None

    def use_name(self, path: str) -> None:
        with _registry_lock:
            _ofd(self.fd, fcntl.F_OFD_SETLK, fcntl.F_RDLCK, name_slot(path))
            self.names.add(path)

    def locked_anywhere(self, run_id: str) -> bool:
        """Whether a live owner (this process's or another's) holds the run; one-shot writers do not count."""
        with _registry_lock:
            if run_id in self.held:
                return True
            if self.passing.get(run_id):
                return False  # our own shared lock: another process's owner could not hold it now
            probe = _ofd(self.fd, fcntl.F_OFD_GETLK, fcntl.F_RDLCK, slot(run_id))
            return probe != fcntl.F_UNLCK


_registry_lock = threading.RLock()
_files: dict[tuple[int, int], SharedFile] = {}


def no_opens() -> threading.RLock:
    """Held while a look at a file (``open_here``, then a descriptor opened, read and closed) must not
    meet another thread's open of that file: ``acquire`` registers a file under this lock, before SQLite
    opens it, and ``release`` forgets it under this lock, after SQLite closed it.

    Checked and read apart, a thread's sidecar check found the file not open here, opened its ``-shm``,
    another thread's store opened the file meanwhile (SQLite took its lock on the -shm), and the check's
    close dropped that lock: another process then took the index for unused and truncated it, and the
    runner holding it mapped died of SIGBUS (two attempts of a runner each opening the effect store).
    """
    return _registry_lock


def create_empty(path: str) -> bool:
    """Create ``path`` as an empty file readable by its owner only (0600) unless something is there already;
    whether this call made it (``OSError`` for any other failure).

    Made and closed under ``no_opens``: two threads opening one new store at once (a fleet runner's two
    attempts with one ``--effects``), the second saw the file the first had just made, opened it with
    SQLite, and the first's close of its creating descriptor dropped the second's SHARED lock on the file
    (another process's last close then deletes the WAL the second writes into).
    """
    with _registry_lock:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return False
        os.close(fd)
        return True


# The names SQLite gives a database's WAL, shared-memory index and rollback journal: its name plus these.
SIDECARS = ("-wal", "-shm", "-journal")


def refuse_open_here(path: str, what: str) -> None:
    """``FileInUse`` if ``path`` is a file this process has open through effectlog, or the ``-wal``, ``-shm``
    or ``-journal`` beside one (SQLite holds its locks on the -shm); call under ``no_opens`` and keep
    holding it while a descriptor of ``path`` is opened, read and closed (a plan, a trace)."""
    names = [path, *(path[: -len(suffix)] for suffix in SIDECARS if path.endswith(suffix))]
    if any(open_here(name) for name in names) or _a_sidecar_here(path):
        raise FileInUse(
            f"{path}: a journal or store this process has open (or its SQLite file beside it), not a {what} "
            f"file (reading it here would drop SQLite's locks on it); give the {what}'s own path; nothing was "
            "read or written"
        )


def _a_sidecar_here(path: str) -> bool:
    """Whether the file at ``path`` is the ``-wal``, ``-shm`` or ``-journal`` of a file open here, by the file
    the kernel reaches (a symlink to it, a hard link, ``/proc/self/fd/N``), not by the text of ``path``."""
    key = path_key(path)
    if key is None:
        return False
    with _registry_lock:
        names = [name for shared in _files.values() for name in shared.names]
    for name in names:
        for suffix in SIDECARS:
            try:
                side = os.stat(name + suffix)
            except OSError:
                continue
            if (side.st_dev, side.st_ino) == key:
                return True
    return False


@contextmanager
def registered(path: str, connect: Callable[[], sqlite3.Connection]) -> Iterator[sqlite3.Connection]:
    """A short-lived SQLite connection ``connect()`` opens to the file at ``path`` (which must exist),
    registered as effectlog's other connections are (``acquire`` before it opens, ``opened``; released
    after it closed), so that a sidecar check in another thread sees the file open here and closes no
    descriptor of it or of its ``-shm`` under this connection's locks. ``OSError`` if it cannot be opened.
    """
    shared = acquire(path, write=False)
    try:
        db = connect()
        opened(db, path)
        try:
            yield db
        finally:
            if may_close(db):
                db.close()
    finally:
        release(shared)


def acquire(path: str, *, write: bool = True) -> SharedFile:
    """The shared descriptor of the file at ``path`` (which must exist), one more reference to it.

    Locks need a descriptor open for writing; a reader (which only probes locks) makes do
    with a read-only one, replaced by a writable one when a writer of the process comes.
    """
    with _registry_lock:
        # Already open here by this name's file: one more reference, no new descriptor (a second one
        # could never be closed before the first: closing it would drop SQLite's locks on the file).
        try:
            st = os.stat(path)
        except OSError:
            pass
        else:
            shared = _files.get((st.st_dev, st.st_ino))
            if shared is not None and (shared.writable or not write):
                shared.refs += 1
                return shared
    fd = os.open(path, (os.O_RDWR if write else os.O_RDONLY) | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        if key in _inherited_keys:
            os.close(fd)
            fd = -1
            raise JournalInherited(f"{path}: {INHERITED_ADVICE}")
        with _registry_lock:
            shared = _files.get(key)
            if shared is None:
                try:
                    wal_fd = _mark_wal(path, key, create=write)
                except BaseException:
                    os.close(fd)  # not shared yet: no lock of this process's SQLite on the file rides on it
                    fd = -1
                    raise
                shared = _files[key] = SharedFile(key, fd, writable=write)
                shared.wal_fd, shared.wal_key = wal_fd, identity(wal_fd)
                # The name's byte before IN_USE, for earlier versions' check (see IN_USE): a process
                # they see holding IN_USE holds its name's byte already.
                _ofd(fd, fcntl.F_OFD_SETLK, fcntl.F_RDLCK, name_slot(path))
                _ofd(fd, fcntl.F_OFD_SETLK, fcntl.F_RDLCK, IN_USE)
                fd = -1  # kept: it is the shared one now
            elif write and not shared.writable:
                if shared.wal_fd < 0:  # a reader found no WAL there: the writer makes it and marks it
                    shared.wal_fd = _mark_wal(path, key, create=True)
                    shared.wal_key = identity(shared.wal_fd)
                _spare.setdefault(key, []).append(shared.fd)  # keeps its IN_USE lock until the file is closed
                shared.fd, shared.writable, fd = fd, True, -1
                _ofd(shared.fd, fcntl.F_OFD_SETLK, fcntl.F_RDLCK, IN_USE)
            shared.refs += 1
            return shared
    finally:
        if fd >= 0:
            # Another descriptor of this file is already open and shared: closing this one
            # would drop the process's POSIX locks on the file (SQLite's). Keep it open
            # beside the shared one instead; it is closed with it.
            _spare.setdefault(key, []).append(fd)


_spare: dict[tuple[int, int], list[int]] = {}


def _mark_wal(path: str, key: tuple[int, int], *, create: bool) -> int:
    """Mark the WAL beside ``path`` as the one of the database file ``key``; its descriptor (-1 when there
    is no WAL and ``create`` is false: a reader makes none).

    SQLite finds a database's WAL and shared-memory index by name. A file replaced by a rename while a
    process has the old one open (a restore, an rsync) leaves the old file's live WAL and index beside
    the new one: SQLite read the old file's pages from them as the new file's, and the commits of both
    went into one WAL, checkpointed into both files: the new file's history overwritten, ``verify`` ok.
    So each process holds a shared lock on its database file's byte of the WAL, and a lock held on any
    other byte refuses the open (``JournalAliased``, nothing read or written)."""
    wal = path + "-wal"
    try:  # O_NONBLOCK: a FIFO at that name would block a plain open for ever
        fd = os.open(wal, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_CREAT if create else 0), 0o600)
    except FileNotFoundError:
        return -1
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)  # no WAL of any file (a FIFO, a device): SQLite says what it makes of it
        return -1
    digest = hashlib.blake2b(struct.pack("QQ", *key), digest_size=8).digest()
    mine = WAL_MARK_BASE + int.from_bytes(digest, "big") % WAL_MARK_SPAN
    try:
        _ofd(fd, fcntl.F_OFD_SETLK, fcntl.F_RDLCK, mine)
        for start, end in ((WAL_MARK_BASE, mine), (mine + 1, WAL_MARK_BASE + WAL_MARK_SPAN)):
            if end > start and _ofd(fd, fcntl.F_OFD_GETLK, fcntl.F_WRLCK, start, end - start) != fcntl.F_UNLCK:
                raise JournalAliased(
                    f"{path}: {wal} is the WAL of another file that was at this name and is still open (the file "
                    "was replaced by a rename while a process had it open); SQLite would take that file's WAL for "
                    "this one's: stop the process using the old file first; nothing was read or written"
                )
    except BaseException:
        os.close(fd)
        raise
    return fd


def second_name(shared: SharedFile, path: str) -> str | None:
    """How the file opened at ``path`` has a second name now (``None`` if it has not).

    SQLite keeps a database's WAL beside the name it was opened by: a second name of the same file
    (a hard link, a bind mount, a rename while another process has it open) is a second WAL, and what
    was committed through one name and not yet checkpointed is not seen through the other. The
    journal and the effect store both refuse such a name before SQLite opens the file.
    """
    links = os.fstat(shared.fd).st_nlink
    if links > 1:
        return f"has {links} names (hard links)"
    other = shared.other_name(path)
    if other is not None:
        return f"is open under another name ({other})"
    return None


def name_moved(path: str, key: tuple[int, int]) -> bool:
    """Whether ``path`` no longer leads to the file ``key`` (``(st_dev, st_ino)``): renamed or removed."""
    try:
        st = os.stat(path)
    except OSError:
        return True
    return (st.st_dev, st.st_ino) != key


def lock_holders(key: tuple[int, int], byte: int) -> list[int]:
    """The pids of other processes of this host whose descriptors of the file ``key`` hold an OFD lock
    on ``byte`` (``/proc/PID/fdinfo``, as far as this user may read it; no file is opened but those).

    An OFD lock belongs to the open file description, which a child of ``fork()`` shares: a process a
    tool forked without exec (a daemon, a ``multiprocessing`` worker) holds its parent's run locks for
    as long as it lives, after its parent ended."""
    found: list[int] = []
    me = os.getpid()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            with contextlib.suppress(OSError):
                for fd in os.scandir(f"/proc/{entry.name}/fd"):
                    st = os.stat(fd.path)  # (the file the link leads to: stat opens nothing)
                    if (st.st_dev, st.st_ino) != key:
                        continue
                    with open(f"/proc/{entry.name}/fdinfo/{fd.name}") as info:
                        for line in info:
                            parts = line.split()
                            if parts[:1] == ["lock:"] and "OFDLCK" in parts and parts[-2:] == [str(byte)] * 2:
                                found.append(int(entry.name))
                    if found and found[-1] == int(entry.name):
                        break
    return found


def pin_no_checkpoint(shared: SharedFile) -> None:
    """Keep every SQLite connection of this process to the file from checkpointing it when it closes.

    SQLite checkpoints and deletes the WAL when a file's last connection closes, once it gets the
    file's EXCLUSIVE lock. A connection whose WAL or shared-memory index another process replaced
    (``walwatch``) sees another WAL than the file's: its checkpoint would copy that view into the file
    and delete the WAL holding the other process's commits. A read lock on SQLite's first SHARED byte,
    held through this process's own descriptor until it closes (after the connections), refuses that
    EXCLUSIVE lock, so the close leaves the WAL as it is (Python 3.11's sqlite3 has no
    ``SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE``)."""
    if shared.fd >= 0 and not shared.lost:
        with contextlib.suppress(OSError):
            _ofd(shared.fd, fcntl.F_OFD_SETLK, fcntl.F_RDLCK, SQLITE_SHARED_FIRST)


def release(shared: SharedFile) -> None:
    """One reference less; the descriptors close once no journal object of this process uses the file.

    A descriptor is closed only while it is still this file's: one that something else in the process
    closed (``os.closerange`` in a tool) may have its number reused by another file by now."""
    with _registry_lock:
        shared.refs -= 1
        if shared.refs > 0:
            return
        if shared.inherited:
            return  # the parent's descriptors: closing one would drop this process's POSIX locks (SQLite's)
        _files.pop(shared.key, None)
        for fd in [shared.fd, *_spare.pop(shared.key, [])]:
            if identity(fd) == shared.key:
                os.close(fd)
        if shared.wal_fd >= 0 and identity(shared.wal_fd) == shared.wal_key:
            os.close(shared.wal_fd)


def path_key(path: str) -> tuple[int, int] | None:
    """The (st_dev, st_ino) of the file ``path`` reaches (symlinks followed); ``None`` if there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def identity(fd: int) -> tuple[int, int] | None:
    """The (st_dev, st_ino) of the file open at ``fd``; ``None`` if nothing is (or ``fd`` is -1)."""
    if fd < 0:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def descriptors_closed() -> bool:
    """Whether something in this process closed the descriptor of a file effectlog has open here (a tool
    calling ``os.closerange``): SQLite's descriptors of it went too, or will be found elsewhere. Then
    every SQLite connection open here to such a file is left unclosed (``may_close``): its close would
    close descriptor numbers that may belong to other files by now."""
    with _registry_lock:  # not while another thread releases a file: its close is no one else's
        broken = [shared for key, shared in _files.items() if not shared.inherited and identity(shared.fd) != key]
        for shared in broken:
            shared.lost = True
            _abandoned_keys.add(shared.key)
    return bool(broken)


# Files whose descriptors something else closed (``descriptors_closed``), and the connections to them
# left unclosed: kept referenced here, so that no garbage collection closes them either.
_abandoned_keys: set[tuple[int, int]] = set()
_abandoned: list[Any] = []


# Files this process's parent (or an earlier ancestor) had open when it forked this process. SQLite
# keeps one record per file and process of the locks it holds, and the child got the parent's copy:
# a connection the child opened itself to such a file would share it, believe itself holding locks
# the kernel never gave this process, and index its commits through the parent's mapping of the
# -shm file, which other processes may have replaced since (commits reported done, then gone). So
# the child opens none of them (SQLite's own advice: never carry an open database across fork()).
_inherited_keys: set[tuple[int, int]] = set()

INHERITED_ADVICE = (
    "this process is a child of fork() whose parent had this file open, and SQLite cannot use a file in a "
    "child that its parent had open (its lock records and shared-memory mapping came with the fork): use it "
    "from a process that did not inherit it (multiprocessing's 'spawn' or 'forkserver' start method, or fork "
    "before opening it)"
)


# Every SQLite connection effectlog has open (journal, fleet store, effect store), by id, until its
# owner closes it; and, in a child of fork(), the ids of those that came with the fork.
_connections: dict[int, Any] = {}
_inherited_connections: set[int] = set()


def refuse_inherited(path: str) -> None:
    """``JournalInherited`` if ``path`` is a file this process's parent had open when it forked it."""
    if not _inherited_keys:
        return
    key = path_key(path)  # None: no file, nothing of it was inherited
    if key is not None and key in _inherited_keys:
        raise JournalInherited(f"{path}: {INHERITED_ADVICE}")


def open_here(path: str) -> bool:
    """Whether this process has the file at ``path`` open through effectlog (a journal, fleet store or
    effect store, its own or inherited). Then no descriptor of the file or of its sidecars may be opened
    and closed here just to look at it: the close would drop SQLite's locks on that file."""
    key = path_key(path)
    if key is None:
        return False
    with _registry_lock:
        return key in _files or key in _inherited_keys or any(found == key for _, found in _connections.values())


def opened(connection: Any, path: str) -> None:
    """Register a SQLite connection just opened to ``path`` (see ``_forget_inherited``)."""
    with contextlib.suppress(OSError):
        st = os.stat(path)
        _connections[id(connection)] = (connection, (st.st_dev, st.st_ino))


def may_close(connection: Any) -> bool:
    """Forget a connection its owner is closing; ``False`` if it came with a fork: then it must not be
    closed (SQLite's close in the child would act on the parent's lock records, see ``_forget_inherited``);
    ``False`` also for a connection to a file whose descriptors something else closed (``descriptors_closed``)."""
    found = _connections.pop(id(connection), None)
    if found is not None and found[1] in _abandoned_keys:
        _abandoned.append(connection)
        return False
    return id(connection) not in _inherited_connections


def _forget_inherited() -> None:
    """In a child of ``fork()``: the inherited descriptors share their open file descriptions, and
    so every OFD lock, with the parent. A run lock taken through one in the child would be the
    parent's too (both would own the run), and either one's unlock would drop the other's. So the
    child never locks through them (``JournalInherited``), and a journal it opens itself gets a
    description of its own, whose locks exclude the parent's. The inherited descriptors stay open
    until the child exits (closing one would drop the child's own POSIX locks on the file), and so
    do the parent's locks on them.
    """
    global _registry_lock  # noqa: PLW0603 - a new lock: another thread of the parent may have held it at fork()
    _registry_lock = threading.RLock()
    for shared in _files.values():
        shared.inherited = True
        _inherited_keys.add(shared.key)
    # SQLite's record of the locks this process holds on a file was copied from the parent: a close
    # of an inherited connection here believes it is the file's last, takes the EXCLUSIVE lock nobody
    # holds in this process, "checkpoints" through a stale WAL index and deletes the WAL by name, the
    # WAL other processes have committed into since (their commits lost, verify ok). So they are never
    # closed here: their owners' close leaves them (``may_close``), and one reference more each keeps
    # the interpreter's exit from closing them either.
    for connection, key in _connections.values():
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(connection))
        _inherited_connections.add(id(connection))
        _inherited_keys.add(key)
    _connections.clear()
    _files.clear()
    _spare.clear()


os.register_at_fork(after_in_child=_forget_inherited)
