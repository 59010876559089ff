"""The SQLite journal's schema v2 (the row layout (d1), docs/architecture.md): a v1 journal migrates in one
transaction by a writer and verifies unchanged, readers read v1 without writing, a migration killed
with SIGKILL leaves v1 intact, and a run's number (outside the chain) edited by hand is caught by
``verify`` and refused by a resume instead of a step sent again."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from effectlog.errors import ExitStatus, IntegrityError
from effectlog.fleet.contract import noop_plan, requested, started
from effectlog.fleet.sqlite_store import SqliteFleetStore
from effectlog.journal import SqliteJournal, checkpoint
from effectlog.journal.sqlite_schema import MIGRATIONS, V1_EVENTS
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import Runtime, SimulatedCrash

STEPS = 4


def plan_of(run_id: str, steps: int = STEPS) -> Plan:
    return Plan(
        run_id=run_id,
        adapters={"tool": AdapterDecl(type="noop", idempotent=False)},
        steps=tuple(StepDecl(id=f"s{i}", adapter="tool", args={"i": i}) for i in range(steps)),
    )


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EFFECTLOG_CHECKPOINT_EVERY": "1"}
    return subprocess.run(
        [sys.executable, "-m", "effectlog", *args], env=env, capture_output=True, text=True, timeout=120
    )


def _stop_at(step_id: str):  # type: ignore[no-untyped-def]
    def hook(where: str, sid: str) -> None:
        if where == "after_confirm" and sid == step_id:
            raise SimulatedCrash(where)

    return hook


@pytest.fixture(autouse=True)
def every_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint segment with every batch that brings a run 2 events past its last one."""
    monkeypatch.setattr(checkpoint, "EVERY_EVENTS", 2)


def build(path: Path, tmp_path: Path) -> None:
    """A real journal: a finished run driven by ``effectlog run`` (sealed, segments every batch), a run
    stopped after its step s1 (open, segments), and a fleet store in the same file with a leased run."""
    plan_file = tmp_path / "done.json"
    plan_file.write_bytes(msgspec.json.encode(plan_of("done")))
    assert 0 == cli("run", str(plan_file), "--journal", str(path), "--quiet").returncode
    with Runtime(path, crash_hook=_stop_at("s1")) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan_of("half"))
    store = SqliteFleetStore(path)
    try:
        request = store.submit("layout", "k1", noop_plan("fleet-1"), requeue_backoff_s=0.0).request
        lease = store.claim(request.request_id, "r1", 60.0)
        assert lease is not None
        journal = store.leased_journal(lease)
        journal.append([started("fleet-1")])
        journal.append([requested("fleet-1", 2, idempotent=True)])
    finally:
        store.close()


def to_v1(path: Path) -> None:
    """Rewrite the journal as schema v1 wrote it (v1's DDL: ``MIGRATIONS[0]``), row for row, as a journal
    an effectlog before v2 left it."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute(V1_EVENTS.replace("CREATE TABLE events", "CREATE TABLE events_v1", 1))
        db.execute(
            "INSERT INTO events_v1 SELECT n.run_id, e.id & 4294967295, e.step_id, e.phase, e.attempt, e.body, e.hash"
            " FROM events e JOIN runs n ON n.run = e.run ORDER BY n.run_id, e.id"
        )
        db.execute("DROP TABLE events")
        db.execute("DROP TABLE runs")
        db.execute("ALTER TABLE events_v1 RENAME TO events")
        for sql in MIGRATIONS[0][2:]:  # v1's append-only triggers
            db.execute(sql)
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
        db.execute("COMMIT")
    finally:
        db.close()


def schema_version(path: Path) -> str:
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return str(db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0])
    finally:
        db.close()


def v1_rows(path: Path) -> list[tuple[object, ...]]:
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return db.execute("SELECT * FROM events ORDER BY run_id, seq").fetchall()
    finally:
        db.close()


def files(path: Path) -> dict[str, str]:
    """The digest of the journal file and every file beside it (WAL, shared memory)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.parent.iterdir())
        if p.name.startswith(path.name)
    }


def views(path: Path) -> dict[str, str]:
    """What a reader shows: ``status --json`` of every run and each run's ``timeline``."""
    shown = {"status": cli("status", "--journal", str(path), "--json").stdout}
    for run_id in ("done", "half", "fleet-1"):
        done = cli("timeline", "--journal", str(path), "--run-id", run_id)
        assert 0 == done.returncode, done.stderr
        shown[run_id] = done.stdout
    return shown


@pytest.fixture
def v1(tmp_path: Path) -> Path:
    path = tmp_path / "j.db"
    build(path, tmp_path)
    to_v1(path)
    assert "1" == schema_version(path)
    return path


def test_readers_read_a_v1_journal_without_writing_to_it(v1: Path) -> None:
    """``verify``, ``status`` and ``timeline`` read a v1 journal with v1's statements: they succeed, and
    the file and every file beside it are byte for byte as they were (no migration, no write)."""
    before = files(v1)
    done = cli("verify", "--journal", str(v1))
    shown = views(v1)
    assert (0, "1", before) == (done.returncode, schema_version(v1), files(v1)), done.stderr
    assert json.loads(shown["status"])


def test_a_writer_migrates_v1_to_v2_in_one_transaction_and_everything_reads_the_same(v1: Path) -> None:
    """A writer's open rebuilds the table (v2); ``verify`` passes (the chain is over bodies), ``status`` and
    each run's ``timeline`` print exactly what they printed from v1, every row is the same, and the open
    run resumes from where it stopped: each step requested once, none sent again."""
    rows, shown = v1_rows(v1), views(v1)
    SqliteJournal(v1).close()
    assert "2" == schema_version(v1)
    done = cli("verify", "--journal", str(v1))
    assert (0, shown) == (done.returncode, views(v1)), done.stderr
    with SqliteJournal(v1, writer=False) as reader:
        migrated = [
            (run_id, r.seq, r.step_id, r.phase, r.attempt, r.body, r.hash)
            for run_id in reader.runs()
            for r in reader.read(run_id)
        ]
    assert rows == migrated
    with Runtime(v1) as rt:
        assert "completed" == rt.run(plan_of("half")).state
    with SqliteJournal(v1, writer=False) as reader:
        requests = [r.step_id for r in reader.read("half") if r.phase == "step.requested"]
    assert [f"s{i}" for i in range(STEPS)] == requests
    assert 0 == cli("verify", "--journal", str(v1)).returncode


def test_the_console_reads_a_v1_journal_as_it_is_and_counts_the_same_after_the_migration(v1: Path) -> None:
    """The console's change detection (a reader of the file's own layout) counts a v1 journal's events
    without writing to it, and counts the same once a writer migrated it."""
    from effectlog.console.changes import _journal_counts

    before = files(v1)
    counts = {run_id: _journal_counts(str(v1), run_id) for run_id in ("done", "half", "fleet-1", None)}
    assert before == files(v1)
    SqliteJournal(v1).close()
    assert counts == {run_id: _journal_counts(str(v1), run_id) for run_id in ("done", "half", "fleet-1", None)}
    assert counts["half"].startswith("7,")


_CHILD = """
import sys, time
import effectlog.journal.sqlite as js
from effectlog.journal import sqlite_schema as ss
connect = js.SqliteJournal._connect
def stop():
    open(sys.argv[2], "w").close()
    time.sleep(600)
def connected(self, durability):
    db = connect(self, durability)
    db.create_function("killpoint", 0, stop)
    return db
js.SqliteJournal._connect = connected
at = int(sys.argv[3])
step = ss.MIGRATIONS[1]
js.MIGRATIONS = (ss.MIGRATIONS[0], step[:at] + ("SELECT killpoint()",) + step[at:])
js.SqliteJournal(sys.argv[1])
"""


@pytest.mark.parametrize("at", [6, 7, 8, len(MIGRATIONS[1])], ids=["copied", "dropped", "renamed", "end"])
def test_a_migration_killed_with_sigkill_leaves_the_v1_journal_intact(v1: Path, tmp_path: Path, at: int) -> None:
    """A real process migrating the journal is SIGKILLed inside the migration's transaction (after the rows
    are copied, after the old table is dropped, after the rename, before the commit): the journal is v1
    with every row as it was, readers verify it, and the next writer migrates it."""
    rows = v1_rows(v1)
    mark = tmp_path / "reached"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(v1), str(mark), str(at)])
    deadline = time.monotonic() + 60
    while not mark.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mark.exists()
    child.send_signal(signal.SIGKILL)
    assert -signal.SIGKILL == child.wait(30)
    assert ("1", rows) == (schema_version(v1), v1_rows(v1))
    assert 0 == cli("verify", "--journal", str(v1)).returncode
    SqliteJournal(v1).close()
    assert ("2", 0) == (schema_version(v1), cli("verify", "--journal", str(v1)).returncode)


# -- a run's number edited by hand -------------------------------------------------------------------


@pytest.fixture
def v2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A v2 journal: ``done`` finished (sealed), ``half`` stopped after s1 (open, 7 events, a checkpoint
    segment with each batch: as in v1, a resume replays from the last segment and ``verify`` reads all)."""
    monkeypatch.setattr(checkpoint, "EVERY_EVENTS", 1)
    path = tmp_path / "j.db"
    with Runtime(path) as rt:
        assert "completed" == rt.run(plan_of("done")).state
    with Runtime(path, crash_hook=_stop_at("s1")) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan_of("half"))
    with SqliteJournal(path, writer=False) as reader:
        assert 7 == reader.head("half")[0]
    return path


def _number(db: sqlite3.Connection, run_id: str) -> int:
    """The run's number in ``runs``."""
    return int(db.execute("SELECT run FROM runs WHERE run_id = ?", (run_id,)).fetchone()[0])


ATTACKS: dict[str, tuple[str, ...]] = {
    # the two runs' numbers swapped in ``runs`` (done is 1, half is 2)
    "numbers swapped": (
        "UPDATE runs SET run = -1 WHERE run_id = 'half'",
        "UPDATE runs SET run = 2 WHERE run_id = 'done'",
        "UPDATE runs SET run = 1 WHERE run_id = 'half'",
    ),
    # the run's number pointed at one with no rows
    "number moved": ("UPDATE runs SET run = 99 WHERE run_id = 'half'",),
    # the run's row in ``runs`` deleted: its events are under no number
    "number deleted": ("DELETE FROM runs WHERE run_id = 'half'",),
    # the run renamed in ``runs``: its events are another run's
    "run renamed": ("UPDATE runs SET run_id = 'zzz' WHERE run_id = 'half'",),
    # the run's last two rows (seq 6, s1's step.effected, and 7, its step.confirmed) swapped: each at the
    # other's rowid
    "rows swapped": (
        "UPDATE events SET id = (2 << 32 | 1000) WHERE id = (2 << 32 | 6)",
        "UPDATE events SET id = (2 << 32 | 6) WHERE id = (2 << 32 | 7)",
        "UPDATE events SET id = (2 << 32 | 7) WHERE id = (2 << 32 | 1000)",
    ),
    # the run's last row (seq 7) moved under a run number nobody has, its ``run`` column too
    "row moved": ("UPDATE events SET id = (3 << 32 | 1), run = 3 WHERE id = (2 << 32 | 7)",),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_run_number_edited_by_hand_fails_verify_and_a_resume_refuses(v2: Path, attack: str) -> None:
    """The run number is outside the chain (the bodies name the run id): with the append-only triggers
    dropped, ``runs`` edited or a row's rowid moved to another run, ``verify`` exits 7 in one line, and
    resuming the open run raises an integrity error with nothing written, instead of starting it again
    or sending a step a second time."""
    db = sqlite3.connect(v2, isolation_level=None)
    try:
        assert (1, 2) == (_number(db, "done"), _number(db, "half"))
        for (trigger,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            db.execute(f'DROP TRIGGER "{trigger}"')
        for sql in ATTACKS[attack]:
            assert 1 == db.execute(sql).rowcount, sql
        count = db.execute("SELECT count(*) FROM events").fetchone()[0]
    finally:
        db.close()
    done = cli("verify", "--journal", str(v2))
    assert (int(ExitStatus.INTEGRITY), 1) == (done.returncode, len(done.stderr.strip().splitlines())), done.stderr
    with Runtime(v2) as rt, pytest.raises(IntegrityError):
        rt.run(plan_of("half"))
    db = sqlite3.connect(v2)
    try:
        assert count == db.execute("SELECT count(*) FROM events").fetchone()[0]
    finally:
        db.close()


# -- numbering runs ----------------------------------------------------------------------------------


def test_a_run_numbered_in_a_batch_that_rolls_back_is_numbered_again_by_its_next_batch(tmp_path: Path) -> None:
    """A run's number is written in the transaction of its first event; when that transaction rolls back
    (here a failure before the commit), the number goes with it and the writer forgets it: the next
    batch numbers the run again, and the run reads back whole under the one number it has."""
    from effectlog.journal.sqlite import SqliteJournal as Journal
    from effectlog.testing import sample_run

    history = sample_run("r", steps=1)
    with Journal(tmp_path / "j.db") as journal:
        journal.claim("r")

        def fail(events: object) -> None:
            raise RuntimeError("before the commit")

        journal.before_commit = fail
        with pytest.raises(RuntimeError):
            journal.append(history[:1])
        journal.before_commit = None
        assert [] == journal.runs()
        journal.append(history[:1])
        journal.append(history[1:])
        assert (["r"], [e.seq for e in history]) == (journal.runs(), [r.seq for r in journal.read("r")])
    db = sqlite3.connect(tmp_path / "j.db")
    try:
        assert [(1, "r")] == db.execute("SELECT run, run_id FROM runs").fetchall()
    finally:
        db.close()


_RACER = """
import sys
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import Runtime
with Runtime(sys.argv[1]) as rt:
    for i in range(int(sys.argv[3])):
        plan = Plan(run_id=f"{sys.argv[2]}-{i}", adapters={"tool": AdapterDecl(type="noop")},
                    steps=(StepDecl(id="s0", adapter="tool", args={}),))
        assert rt.run(plan).state == "completed"
"""


def test_two_processes_numbering_new_runs_at_once_give_each_run_its_own_number(tmp_path: Path) -> None:
    """Two real processes start new runs on one journal at the same time: each run is numbered in its
    first event's transaction (the file's write lock), so the numbers are 1..n, one per run, and the
    journal verifies."""
    path, each = tmp_path / "j.db", 40
    SqliteJournal(path).close()
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, str(path), name, str(each)]) for name in "ab"]
    assert [0, 0] == [p.wait(120) for p in racers]
    db = sqlite3.connect(path)
    try:
        numbers = db.execute("SELECT run, run_id FROM runs ORDER BY run").fetchall()
    finally:
        db.close()
    assert list(range(1, 2 * each + 1)) == [n for n, _ in numbers]
    assert sorted(f"{name}-{i}" for name in "ab" for i in range(each)) == sorted(r for _, r in numbers)
    assert 0 == cli("verify", "--journal", str(path)).returncode
