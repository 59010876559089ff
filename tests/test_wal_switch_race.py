"""Two threads (or processes) opening one NEW SQLite file at the same moment: the journal, the effect
store and the fleet store each switch a new file to WAL. The switch reads the file's header under a
read lock, then asks for the write lock; when another connection holds that (it is switching the same
file), SQLite answers ``SQLITE_BUSY`` at once instead of calling the busy handler (a reader waiting
for a writer that waits for the reader would deadlock), measured at ~0.2 ms with a 60 s busy timeout.
Two workers starting on a fresh journal then failed one of them with ``database is locked``. These
tests prove each opener waits its turn instead (the switch is retried until the busy timeout)."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from effectlog.adapters.effects import EffectStore
from effectlog.fleet.sqlite_store import SqliteFleetStore
from effectlog.journal.sqlite import SqliteJournal

ROUNDS = 60
THREADS = 4


def _open_journal(path: Path) -> object:
    return SqliteJournal(path)


def _open_effect_store(path: Path) -> object:
    return EffectStore(path)


def _open_fleet_store(path: Path) -> object:
    return SqliteFleetStore(path)


OPENERS = pytest.mark.parametrize(
    "opener", [_open_journal, _open_effect_store, _open_fleet_store], ids=["journal", "effect_store", "fleet_store"]
)


@OPENERS
def test_an_open_waits_while_another_connection_holds_the_write_lock_of_a_new_file(
    tmp_path: Path, opener: Callable[[Path], object]
) -> None:
    """The race made certain: another connection holds the write lock of the new (empty) file, as a
    second opener does while it switches the file to WAL, and lets go after 0.3 s. Proves: the open
    waits for it and succeeds (before the fix it failed at once with ``database is locked``)."""
    path = tmp_path / "new.db"
    path.touch()
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    timer = threading.Timer(0.3, other.execute, ("COMMIT",))
    timer.start()
    started = time.monotonic()
    try:
        opener(path)
        waited = time.monotonic() - started
    finally:
        timer.join()
        other.close()
    assert (True, b"\x02\x02") == (waited >= 0.2, path.read_bytes()[18:20])


@OPENERS
def test_two_threads_opening_one_new_file_both_succeed(tmp_path: Path, opener: Callable[[Path], object]) -> None:
    """Proves: in every round, both of two threads opening the same new file at once get it open
    (no ``database is locked``), and the file is in WAL mode afterwards."""
    failures: list[str] = []
    modes: set[bytes] = set()
    for round_no in range(ROUNDS):
        path = tmp_path / f"f{round_no}.db"
        gate = threading.Barrier(THREADS)

        def open_it(path: Path = path, gate: threading.Barrier = gate, round_no: int = round_no) -> None:
            gate.wait(10)
            try:
                opener(path)
            except Exception as exc:  # the failure under test: recorded, asserted below
                failures.append(f"{round_no}: {exc}")

        threads = [threading.Thread(target=open_it) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        modes.add(path.read_bytes()[18:20])  # file format write/read versions: 2, 2 is WAL
    assert ([], {b"\x02\x02"}) == (failures[:3], modes), len(failures)
