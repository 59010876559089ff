"""Attack round 16: a descriptor opened and closed in-process drops SQLite's locks on the file.

POSIX locks belong to the process: closing ANY descriptor of a file drops all of its locks on it,
SQLite's included (its SHARED lock on the database, its "DMS" lock on byte 128 of the ``-shm``).
Without the DMS lock another process takes the shared-memory index for unused and truncates it under
this process's mapping (SIGBUS), or checkpoints and restarts the WAL under a reader. Each test here
opens and closes a descriptor of a file this process's SQLite uses, by a path not yet covered by
tests/test_sidecar_checks_keep_locks.py, and asks another process whether the DMS lock is still held.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from effectlog.adapters.effects import EffectStore
from effectlog.console import changes
from effectlog.console.decisions import Config
from effectlog.errors import BadInput
from effectlog.journal.sqlite import SqliteJournal
from effectlog.runtime import Runtime
from lock_watch import PAUSE_S, WatchedLock, race, watch_no_opens

# Another process asks the kernel whether a write lock on a byte range would be refused: then someone
# holds a lock there (only this test's process has the file open when it asks).
_PROBE = """
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR)
wanted = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, int(sys.argv[2]), int(sys.argv[3]), 0)
print(struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_GETLK, wanted))[0] != fcntl.F_UNLCK)
"""


def _locked(path: Path, start: int, length: int) -> bool:
    command = [sys.executable, "-c", _PROBE, str(path), str(start), str(length)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return done.stdout.strip() == "True"


def _dms_held(shm: Path) -> bool:
    """SQLite's UNIX_SHM_DMS (byte 128 of the -shm): held shared by every process using the index."""
    return _locked(shm, 128, 1)


def _shared_held(db: Path) -> bool:
    """SQLite's SHARED lock on the database file (SHARED_FIRST, 510 bytes from 1 GiB + 2): in WAL mode a
    connection holds it while open, which keeps another process's last close from deleting the WAL."""
    return _locked(db, 0x4000_0002, 510)


OPENERS: dict[str, Callable[[Path], Any]] = {"journal": SqliteJournal, "effect-store": EffectStore}

_HOLDER = """
import sys
from effectlog.adapters.effects import EffectStore
from effectlog.journal.sqlite import SqliteJournal
kinds = {"journal": SqliteJournal, "effect-store": EffectStore}
held = kinds[sys.argv[1]](sys.argv[2])
print("open", flush=True)
sys.stdin.readline()
held.close()
"""


class _Holder:
    """Another process with the file open (so its -shm exists and stays while this one opens it)."""

    def __init__(self, kind: str, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, kind, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        assert "open" == self.proc.stdout.readline().strip()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("close\n")
        self.proc.stdin.flush()
        assert 0 == self.proc.wait(30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def holders() -> Iterator[list[_Holder]]:
    made: list[_Holder] = []
    yield made
    for holder in made:
        holder.kill()


def _race(
    watched: WatchedLock,
    paused: Callable[[], None],
    pause_when: Callable[[FrameType, Any], bool],
    meanwhile: Callable[[], Any],
) -> Any:
    """Run ``paused`` in a thread that stops at the first C call ``pause_when`` matches; while it is
    stopped there, run ``meanwhile`` in another thread until it has finished or waits for ``no_opens``
    (an opener kept waiting by the paused thread is let through when that one goes on). Returns what
    ``meanwhile`` returned."""
    stopped, go = threading.Event(), threading.Event()
    let_go: list[bool] = []  # whether the paused thread went on because it was let go (not by a timeout)

    def hook(frame: FrameType, event: str, arg: object) -> None:
        if event == "c_call" and not stopped.is_set() and pause_when(frame, arg):
            stopped.set()
            let_go.append(go.wait(PAUSE_S))

    failures: list[BaseException] = []

    def first() -> None:
        sys.setprofile(hook)
        try:
            paused()
        except BaseException as exc:  # reported by the caller's assert
            failures.append(exc)
        finally:
            sys.setprofile(None)

    results: list[Any] = []
    one = threading.Thread(target=first)
    two = threading.Thread(target=lambda: results.append(meanwhile()))
    assert [] == race(one, stopped, two, go=go, watched=watched, what="meanwhile, while the first thread was paused")
    assert ([], [True]) == (failures, let_go)
    assert len(results) == 1
    return results[0]


@pytest.mark.parametrize("kind", sorted(OPENERS))
def test_two_threads_creating_one_new_file_keep_sqlites_lock_on_it(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two attempts of a fleet runner (``--capacity 2 --effects new.db``), or two concurrent runs' adapters,
    open a store that does not exist yet. The first creates the empty file (``O_CREAT|O_EXCL``) and closes
    that descriptor; the second, seeing the file there, opens it with SQLite in between. The first's close
    then dropped the second's SQLite locks (its SHARED lock on the file: another process's last close then
    deletes the WAL this process writes into).

    Proves: once both are open, SQLite's SHARED lock on the file is held (the creation's close never
    lands while another thread's SQLite has the file open).
    """
    path = tmp_path / "new.db"
    opened: list[Any] = []

    def creator() -> None:
        opened.append(OPENERS[kind](path))

    try:
        watched = watch_no_opens(monkeypatch)
        second = _race(watched, creator, lambda frame, arg: arg is os.close, lambda: OPENERS[kind](path))
        opened.append(second)
        assert _shared_held(path)
    finally:
        for store in opened:
            store.close()


def test_a_console_version_read_beside_a_journal_open_keeps_sqlites_lock_on_its_shm(
    tmp_path: Path, holders: list[_Holder], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console's change feed reads the journal's counts through a SQLite connection of its own
    (``changes._journal_counts``), in a worker thread, while another worker thread opens the journal for
    a page (``decisions.reading``). That connection was not registered with filelocks: the page's sidecar
    check found the journal not open here, opened its -shm to read the header, and its close dropped the
    DMS lock the feed's connection had taken; the page's journal then mapped the index with no lock of
    this process on it (a runner opening the journal next truncates it: the console dies of SIGBUS).

    Proves: after the feed's read and the page's open, with the other process gone, the page's journal
    still holds SQLite's DMS lock on the -shm.
    """
    path = tmp_path / "j.db"
    holder = _Holder("journal", path)
    holders.append(holder)
    config = Config(journal=str(path), users={})

    def in_the_count(frame: FrameType, arg: object) -> bool:
        return frame.f_code is changes._count.__code__ and getattr(arg, "__name__", "") == "fetchone"

    watched = watch_no_opens(monkeypatch)
    reader = _race(
        watched, lambda: changes._read_version(config, None), in_the_count, lambda: SqliteJournal(path, writer=False)
    )
    try:
        holder.close()
        assert _dms_held(tmp_path / "j.db-shm")
    finally:
        reader.close()


@pytest.mark.parametrize("name", ["j.db", "j.db-shm"])
def test_a_runtime_given_its_journal_as_the_plan_refuses_it_and_keeps_the_journals_locks(
    name: str, tmp_path: Path
) -> None:
    """A tired operator passes the journal's path where the plan goes (``runtime.run("j.db")``). The plan
    reader opened the journal file, read it, closed it (dropping the runtime's SQLite locks on it), then
    said it is no plan; the runtime went on with the next plan with no lock on its journal.

    Proves: the plan (the journal file, or its -shm) is refused (bad input, naming the file), and SQLite's
    SHARED lock on the journal file and DMS lock on its -shm are held before and after.
    """
    path = tmp_path / "j.db"
    with Runtime(str(path)) as runtime:
        before = (_shared_held(path), _dms_held(tmp_path / "j.db-shm"))
        with pytest.raises(BadInput, match=re.escape(name)):
            runtime.run(str(tmp_path / name))
        assert ((True, True), (True, True)) == (before, (_shared_held(path), _dms_held(tmp_path / "j.db-shm")))


@pytest.mark.parametrize("what", ["journal", "effect-store"])
def test_a_runtime_given_a_database_it_has_open_as_its_trace_refuses_it(what: str, tmp_path: Path) -> None:
    """``Runtime(journal, trace=...)`` given the journal's own path (or an effect store this process has
    open): the trace read the file's last line (an open and a close: the journal's SQLite locks dropped)
    and kept a descriptor to append JSON lines into the database file.

    Proves: the trace is refused (bad input), nothing is appended to the file, and SQLite's SHARED lock
    on the file is held before and after.
    """
    journal = SqliteJournal(tmp_path / "j.db")
    store = EffectStore(tmp_path / "e.db")
    target = tmp_path / ("j.db" if what == "journal" else "e.db")
    try:
        size, before = target.stat().st_size, _shared_held(target)
        with pytest.raises(BadInput, match=re.escape(target.name)):
            Runtime(journal, trace=str(target))
        assert (size, True, True) == (target.stat().st_size, before, _shared_held(target))
    finally:
        store.close()
        journal.close()


@pytest.mark.parametrize("name", ["j.db", "./j.db", "sub/../j.db", "link.db"])
def test_an_effect_store_opened_on_the_journal_file_is_refused_and_keeps_the_journals_locks(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal and the effect store given as one file under different names (``--journal j.db
    --effects ./j.db``, a symlink), through the API, where no CLI check runs first. The store's open
    goes through the journal's shared descriptor: nothing is closed under the journal's connection.

    Proves (regression; nothing found): the store is refused (bad input, nothing written to the file) and
    SQLite's SHARED lock on the journal file and DMS lock on its -shm are still held.
    """
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.db").symlink_to("j.db")
    journal = SqliteJournal(tmp_path / "j.db")
    try:
        tables = journal._db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        with pytest.raises(BadInput, match="not an effect store"):
            EffectStore(name)
        after = journal._db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        assert (tables, True, True) == (after, _shared_held(tmp_path / "j.db"), _dms_held(tmp_path / "j.db-shm"))
    finally:
        journal.close()


@pytest.mark.parametrize("kind", sorted(OPENERS))
def test_threads_opening_and_closing_one_file_at_once_keep_sqlites_locks(kind: str, tmp_path: Path) -> None:
    """Four threads each open and close the same file over and over (a fleet runner's attempts, each with
    its store), racing the last close of one against the open of another; meanwhile every few rounds one
    thread keeps its object open across the others' closes.

    Proves (regression; nothing found): after the storm, an object still open holds SQLite's SHARED lock
    on the file and its DMS lock on the -shm, and every open succeeded.
    """
    path = tmp_path / "x.db"
    OPENERS[kind](path).close()  # made once: the creation race has its own test above
    kept: list[Any] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def churn(n: int) -> None:
        start.wait()
        try:
            for round_no in range(25):
                held = OPENERS[kind](path)
                if n == 0 and round_no == 24:
                    kept.append(held)
                else:
                    held.close()
        except BaseException as exc:  # reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    try:
        assert ([], 1) == (errors, len(kept))
        assert (True, True) == (_shared_held(path), _dms_held(tmp_path / "x.db-shm"))
    finally:
        for held in kept:
            held.close()


@pytest.mark.parametrize("sidecar", ["-shm", "-wal"])
def test_a_runtime_given_its_journals_sidecar_as_the_trace_refuses_it(sidecar: str, tmp_path: Path) -> None:
    """``Runtime(journal, trace="j.db-shm")`` (a tab completion one step too far; the CLI's ``--trace``
    check refuses these names, the API did not): the trace read the -shm's last line and closed it,
    dropping the DMS lock of the journal's SQLite on it, and kept a descriptor to append JSON lines into
    SQLite's shared-memory index or WAL.

    Proves: the trace is refused (bad input naming the file), the sidecar keeps its size, and SQLite's DMS
    lock on the -shm is still held.
    """
    journal = SqliteJournal(tmp_path / "j.db")
    target = tmp_path / f"j.db{sidecar}"
    try:
        size, before = target.stat().st_size, _dms_held(tmp_path / "j.db-shm")
        with pytest.raises(BadInput, match=re.escape(target.name)):
            Runtime(journal, trace=str(target))
        assert (size, True, True) == (target.stat().st_size, before, _dms_held(tmp_path / "j.db-shm"))
    finally:
        journal.close()
