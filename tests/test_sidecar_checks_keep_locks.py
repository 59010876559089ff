"""The sidecar check (``journal/sidecars.py``) reads files beside a database before SQLite opens it;
it must never open and close a file this process's SQLite connections hold locks on.

POSIX locks belong to the process: closing ANY descriptor of a file drops all of them. The check read
``x.db-shm`` to see whether it held a database of its own, on every open, also when this process
already had ``x.db`` open: its close dropped SQLite's lock on the -shm's "DMS" byte, which tells other
processes the shared-memory index is in use. Another process then took itself for the first user,
truncated and rebuilt the index under this process's mapping, and runner processes died of SIGBUS
(two attempts of one runner open the same effect store; tests/test_fleet_processes.py's racing
runners). Proves, for the journal, the effect store and the SQLite fleet store: a second object
opened on a file this process has open leaves SQLite's lock on the -shm held, as a second process
sees it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from effectlog.adapters.effects import EffectStore
from effectlog.fleet.sqlite_store import SqliteFleetStore
from effectlog.journal import sidecars
from effectlog.journal.sqlite import SqliteJournal
from lock_watch import PAUSE_S, race, watch_no_opens

# Another process asks the kernel who holds a write lock's way at byte 128 of the -shm (SQLite's
# UNIX_SHM_DMS: every connection using the index holds it shared).
_PROBE = """
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR)
wanted = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 128, 1, 0)
print(struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_GETLK, wanted))[0] != fcntl.F_UNLCK)
"""


def _dms_held(shm: Path) -> bool:
    done = subprocess.run([sys.executable, "-c", _PROBE, str(shm)], capture_output=True, text=True, check=True)
    return done.stdout.strip() == "True"


OPENERS: dict[str, Callable[[Path], Any]] = {
    "journal": SqliteJournal,
    "effect-store": EffectStore,
    "fleet-store": SqliteFleetStore,
}


@pytest.mark.parametrize("kind", sorted(OPENERS))
def test_opening_a_file_this_process_has_open_keeps_sqlites_lock_on_its_shm(kind: str, tmp_path: Path) -> None:
    """Proves: the first object's lock on the -shm is held before and after a second open and close."""
    path = tmp_path / "x.db"
    first = OPENERS[kind](path)
    try:
        before = _dms_held(tmp_path / "x.db-shm")
        second = OPENERS[kind](path)
        second.close()
        assert (True, True) == (before, _dms_held(tmp_path / "x.db-shm"))
    finally:
        first.close()


_HOLDER = """
import sys
from effectlog.adapters.effects import EffectStore
from effectlog.fleet.sqlite_store import SqliteFleetStore
from effectlog.journal.sqlite import SqliteJournal
kinds = {"journal": SqliteJournal, "effect-store": EffectStore, "fleet-store": SqliteFleetStore}
held = kinds[sys.argv[1]](sys.argv[2])
print("open", flush=True)
sys.stdin.readline()
held.close()
"""


@pytest.mark.parametrize("kind", sorted(OPENERS))
def test_a_check_in_one_thread_never_drops_the_lock_of_a_file_another_thread_opens_meanwhile(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads of one process open the same file at once (two attempts of a fleet runner, each with
    its effect store; CI's racing runners died of SIGBUS, exit -7). One thread's sidecar check has the
    -shm open (another process has the file open, so it exists) when the other thread's SQLite opens the
    file and takes its lock on the -shm; the check's close then dropped that lock.

    Proves: once both opens are done and the other process has closed the file, the second thread's
    store still holds SQLite's lock on the -shm (the check and a registration are one at a time).
    """
    path = tmp_path / "x.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, kind, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    assert holder.stdin is not None
    try:
        assert "open" == holder.stdout.readline().strip()
        checking, go = threading.Event(), threading.Event()
        let_go: list[bool] = []  # whether the check went on because it was let go (not by a timeout)

        def pause_in_the_shm_read(frame: FrameType, event: str, arg: object) -> None:
            if (
                event == "c_call"
                and frame.f_code is sidecars._database.__code__
                and str(frame.f_locals.get("path", "")).endswith("-shm")
                and getattr(arg, "__name__", "") == "read"
            ):
                checking.set()
                let_go.append(go.wait(PAUSE_S))

        def check() -> None:
            sys.setprofile(pause_in_the_shm_read)
            try:
                sidecars.refuse_clash(str(path), kind)
            finally:
                sys.setprofile(None)

        opened: list[Any] = []
        watched = watch_no_opens(monkeypatch)
        checker = threading.Thread(target=check)
        opener = threading.Thread(target=lambda: opened.append(OPENERS[kind](path)))
        alive = race(checker, checking, opener, go=go, watched=watched, what="the open while the check reads the -shm")
        assert ([], [True]) == (alive, let_go)
        holder.stdin.write("close\n")
        holder.stdin.flush()
        assert 0 == holder.wait(30)
        try:
            assert _dms_held(tmp_path / "x.db-shm")
        finally:
            opened[0].close()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
