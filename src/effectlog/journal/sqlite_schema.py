"""The SQLite journal's schema and SQL: migrations, derived tables (seals, owners), statements,
and how SQLite's errors read to a user. ``SqliteJournal`` (``effectlog.journal.sqlite``) uses them."""

from __future__ import annotations

import os
import sqlite3
from typing import Literal, NamedTuple

from effectlog.errors import CorruptEvent, JournalDamaged, JournalUnreadable, StorageError

Durability = Literal["full", "normal"]

# The SQLite journal's own schema version (PostgreSQL's is ``protocol.SCHEMA_VERSION``, unchanged at 1).
# v1: events ``WITHOUT ROWID`` keyed ``(run_id, seq)``. v2: the row layout (d1) of docs/architecture.md:
# runs interned in ``runs``, each event a rowid ``run << 32 | seq``, one index ``(run, step_id, phase,
# attempt)``. Only a writer migrates (``MIGRATIONS``); readers read either (``LAYOUTS``).
SQLITE_SCHEMA_VERSION = 2

V1_EVENTS = """CREATE TABLE events (
            run_id TEXT NOT NULL,
            seq INTEGER NOT NULL CHECK (seq > 0),
            step_id TEXT NOT NULL,
            phase TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            body BLOB NOT NULL,
            hash BLOB NOT NULL,
            PRIMARY KEY (run_id, seq),
            UNIQUE (run_id, step_id, phase, attempt)
        ) WITHOUT ROWID"""
_APPEND_ONLY = (
    """CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
           BEGIN SELECT RAISE(ABORT, 'effectlog: events are append-only'); END""",
    """CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
           BEGIN SELECT RAISE(ABORT, 'effectlog: events are append-only'); END""",
)
# The run's number is outside the chain (the bodies name their run id): ``verify`` reads a run by its
# number from ``runs`` and the fold checks each body names the run asked for, as it checks step_id,
# phase and attempt; a run number is never reused or renamed (append-only), and the CHECK ties the
# ``run`` column (the dedup index's) to the rowid.
V2_DDL: tuple[str, ...] = (
    "CREATE TABLE runs (run INTEGER PRIMARY KEY, run_id TEXT NOT NULL UNIQUE)",
    """CREATE TRIGGER runs_append_only_update BEFORE UPDATE ON runs
           BEGIN SELECT RAISE(ABORT, 'effectlog: runs are append-only'); END""",
    """CREATE TRIGGER runs_append_only_delete BEFORE DELETE ON runs
           BEGIN SELECT RAISE(ABORT, 'effectlog: runs are append-only'); END""",
    """CREATE TABLE events_v2 (
            id INTEGER PRIMARY KEY,
            run INTEGER NOT NULL,
            step_id TEXT NOT NULL,
            phase TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            body BLOB NOT NULL,
            hash BLOB NOT NULL,
            CHECK (run > 0 AND id >> 32 = run AND (id & 4294967295) > 0),
            UNIQUE (run, step_id, phase, attempt)
        )""",
)
# v1 -> v2 in the migration's one transaction: number the runs in id order, copy every row to its
# rowid (bodies and hashes as they are: the chain is over bodies, so it verifies unchanged), drop the
# old table (its triggers go with it), rename, and put the append-only triggers back.
_V1_TO_V2: tuple[str, ...] = (
    *V2_DDL,
    "INSERT INTO runs (run_id) SELECT run_id FROM events GROUP BY run_id ORDER BY run_id",
    "INSERT INTO events_v2 (id, run, step_id, phase, attempt, body, hash) SELECT n.run << 32 | e.seq, n.run,"
    " e.step_id, e.phase, e.attempt, e.body, e.hash FROM events e JOIN runs n ON n.run_id = e.run_id"
    " ORDER BY n.run, e.seq",
    "DROP TABLE events",
    "ALTER TABLE events_v2 RENAME TO events",
    *_APPEND_ONLY,
)

# Ordered migrations: index i brings schema version i to i + 1.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    ("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)", V1_EVENTS, *_APPEND_ONLY),
    _V1_TO_V2,
)
assert len(MIGRATIONS) == SQLITE_SCHEMA_VERSION

# The writer's insert (v2 only: a writer migrates first), one row's parameters: run number, seq,
# step_id, phase, attempt, body, hash. Numbered parameters, so each row's run number is bound once.
INSERT_ROW = "(?{0} << 32 | ?{1}, ?{0}, ?{2}, ?{3}, ?{4}, ?{5}, ?{6})"
INSERT_HEAD = "INSERT INTO events (id, run, step_id, phase, attempt, body, hash) VALUES "


def insert_rows(count: int) -> str:
    """``INSERT`` of ``count`` rows, 7 parameters each (``INSERT_ROW``)."""
    rows = (INSERT_ROW.format(*range(7 * i + 1, 7 * i + 8)) for i in range(count))
    return INSERT_HEAD + ", ".join(rows)


INSERT = insert_rows(1)
META_KEYS = "SELECT key, value FROM meta WHERE key IN ('chain', 'key_fingerprint')"
# The key's fingerprint (``keycheck``): added once, never replaced (a second writer's is ignored, then checked).
INSERT_FINGERPRINT = "INSERT OR IGNORE INTO meta (key, value) VALUES ('key_fingerprint', ?)"
RUN_NUMBER = "SELECT run FROM runs WHERE run_id = ?"
NEW_RUN = "INSERT INTO runs (run_id) VALUES (?) RETURNING run"
# Before a new run number is given: numbers are dense (1..n, never deleted) and no event row lies past
# them, else the ``runs`` table was changed and a run's history would look new (``check_numbering``).
RUN_TRACES = "SELECT 1 FROM seals WHERE run_id = ? UNION ALL SELECT 1 FROM checkpoints WHERE run_id = ? LIMIT 1"
RUN_NUMBERING = "SELECT count(*), COALESCE(max(run), 0), COALESCE((SELECT max(id) >> 32 FROM events), 0) FROM runs"
# The same without the count, for a new run's number: two seeks. count(*) reads every page of the runs
# table's smallest index (77 ms at a million runs), which made each new run's cost grow with the journal's
# history; a number removed from the middle is found by ``runs()`` and ``verify`` (the full check) and, on a
# resume, by the run's owner, seal or checkpoint rows (``RUN_TRACES``).
RUN_TOPS = "SELECT COALESCE((SELECT max(run) FROM runs), 0), COALESCE((SELECT max(id) >> 32 FROM events), 0)"

SEALS_DDL: tuple[str, ...] = (
    """CREATE TABLE seals (
        run_id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL CHECK (seq > 0),
        body BLOB NOT NULL,
        hash BLOB NOT NULL
    )""",
    """CREATE TRIGGER seals_append_only_update BEFORE UPDATE ON seals
       BEGIN SELECT RAISE(ABORT, 'effectlog: seals are append-only'); END""",
    """CREATE TRIGGER seals_append_only_delete BEFORE DELETE ON seals
       BEGIN SELECT RAISE(ABORT, 'effectlog: seals are append-only'); END""",
)
# Who drives (or last drove) each run: operational state beside the history, not part of it.
# The OS lock decides who owns a run; this row only names the owner (``status``, messages).
OWNERS_DDL: tuple[str, ...] = (
    "CREATE TABLE owners (run_id TEXT PRIMARY KEY, token INTEGER NOT NULL, holder TEXT NOT NULL)",
)
UPSERT_OWNER = (
    "INSERT INTO owners (run_id, token, holder) VALUES (?, 1, ?) "
    "ON CONFLICT (run_id) DO UPDATE SET token = token + 1, holder = excluded.holder RETURNING token"
)
READ_PAGE_ROWS = 2000
WAL_AUTOCHECKPOINT_PAGES = 8000  # about 32 MiB of WAL between checkpoints (SQLite's default: 1,000 pages)
INSERT_SEAL = "INSERT INTO seals (run_id, seq, body, hash) VALUES (?, ?, ?, ?)"


class Layout(NamedTuple):
    """The statements that read ``events``, per schema version: a reader picks them by the file's
    version, so a v1 journal is read as it is (no migration on read, no write at all). Each takes
    the same parameters in both layouts."""

    columns: list[str]  # the events table's columns: a table of that name with others is not a journal's
    # The run ids, in order, without reading every event.
    list_runs: str
    # A page of a run's rows after a seq (run_id, after_seq, limit), in ``fold.Row``'s order: seq, body,
    # hash, step_id, phase, attempt. The run id column is not read back: the rows are the run asked for.
    read_page: str
    head: str  # (run_id) -> seq, hash of its last event
    existing: str  # (run_id, seq) -> body, hash
    dedup: str  # (run_id, step_id, phase, attempt) -> seq
    # (run_id) -> the seal's seq, body, hash and the run's last event's seq, hash: one statement, one snapshot.
    select_seal: str
    checkpoint_join: str  # ``checkpoint.select_sql``'s join of a segment ``c`` to its event ``e``
    count_run: str  # (run_id) -> how many events the run has (the console's change detection)
    # () -> run_id, seq, the hash of seq - 1 (NULL if absent), body, hash of the journal's last event
    # (``keycheck.LastLink``): checks a key against a journal from before the key fingerprint.
    last_link: str
    numbered: bool  # runs interned in ``runs`` (v2)


# v1: ``SELECT DISTINCT run_id FROM events ORDER BY run_id`` without reading every event: one seek in the
# primary key per run. SQLite's DISTINCT scans every event (~0.1 ms per 1,000 events: 10 ms for one run
# of 100k events on every ``verify``, ``status``, ``show``); the seeks cost ~3 us per run.
_V1 = Layout(
    columns=["run_id", "seq", "step_id", "phase", "attempt", "body", "hash"],
    list_runs=(
        "WITH RECURSIVE r(id) AS (SELECT min(run_id) FROM events UNION ALL "
        "SELECT (SELECT min(run_id) FROM events WHERE run_id > r.id) FROM r WHERE r.id IS NOT NULL) "
        "SELECT id FROM r WHERE id IS NOT NULL"
    ),
    read_page=(
        "SELECT seq, body, hash, step_id, phase, attempt FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?"
    ),
    head="SELECT seq, hash FROM events WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
    existing="SELECT body, hash FROM events WHERE run_id = ? AND seq = ?",
    dedup="SELECT seq FROM events WHERE run_id = ? AND step_id = ? AND phase = ? AND attempt = ?",
    select_seal=(
        "SELECT s.seq, s.body, s.hash, e.seq, e.hash FROM seals s JOIN events e ON e.run_id = s.run_id "
        "WHERE s.run_id = ? ORDER BY e.seq DESC LIMIT 1"
    ),
    checkpoint_join="LEFT JOIN events e ON e.run_id = c.run_id AND e.seq = c.seq",
    count_run="SELECT count(*) FROM events WHERE run_id = ?",
    last_link=(
        "SELECT e.run_id, e.seq, (SELECT p.hash FROM events p WHERE p.run_id = e.run_id AND p.seq = e.seq - 1), "
        "e.body, e.hash FROM (SELECT run_id, seq, body, hash FROM events ORDER BY run_id DESC, seq DESC LIMIT 1) e"
    ),
    numbered=False,
)
# v2: a run's rows are one rowid range, ``run << 32 | seq``, its number looked up once by run id.
# A run listed in ``runs`` has events (its row is written with its first), so the list is ``runs``'s.
_V2_RANGE = "FROM runs n JOIN events e ON e.id > n.run << 32 AND e.id < (n.run + 1) << 32 WHERE n.run_id = ?"
_V2 = Layout(
    columns=["id", "run", "step_id", "phase", "attempt", "body", "hash"],
    list_runs="SELECT run_id FROM runs ORDER BY run_id",
    read_page=(
        "SELECT e.id & 4294967295, e.body, e.hash, e.step_id, e.phase, e.attempt FROM runs n, events e "
        "WHERE n.run_id = ? AND e.id > (n.run << 32 | ?) AND e.id < (n.run + 1) << 32 ORDER BY e.id LIMIT ?"
    ),
    head=f"SELECT e.id & 4294967295, e.hash {_V2_RANGE} ORDER BY e.id DESC LIMIT 1",
    existing="SELECT e.body, e.hash FROM runs n, events e WHERE n.run_id = ? AND e.id = (n.run << 32 | ?)",
    dedup=(
        "SELECT e.id & 4294967295 FROM runs n, events e WHERE n.run_id = ? AND e.run = n.run "
        "AND e.step_id = ? AND e.phase = ? AND e.attempt = ?"
    ),
    select_seal=(
        "SELECT s.seq, s.body, s.hash, e.id & 4294967295, e.hash FROM seals s, runs n, events e "
        "WHERE s.run_id = ? AND n.run_id = s.run_id AND e.id > n.run << 32 AND e.id < (n.run + 1) << 32 "
        "ORDER BY e.id DESC LIMIT 1"
    ),
    checkpoint_join="LEFT JOIN runs n ON n.run_id = c.run_id LEFT JOIN events e ON e.id = (n.run << 32 | c.seq)",
    count_run=f"SELECT count(*) {_V2_RANGE}",
    last_link=(
        "SELECT (SELECT run_id FROM runs WHERE run = e.run), e.id & 4294967295, "
        "(SELECT p.hash FROM events p WHERE p.id = e.id - 1), e.body, e.hash "
        "FROM (SELECT id, run, body, hash FROM events ORDER BY id DESC LIMIT 1) e"
    ),
    numbered=True,
)
LAYOUTS: dict[int, Layout] = {1: _V1, 2: _V2}


def layout_of(db: sqlite3.Connection) -> Layout:
    """The statements of the journal open on ``db`` (by its ``meta`` schema version), for a reader
    outside ``SqliteJournal`` (the console); the current layout when the version is not one we know."""
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return LAYOUTS.get(int(row[0]) if row and str(row[0]).isdigit() else 0, LAYOUTS[SQLITE_SCHEMA_VERSION])


def translate(exc: sqlite3.Error, path: str) -> Exception:
    text = str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and "not a database" in text:
        return JournalUnreadable(f"{path}: not an effectlog journal (file is not a SQLite database)")
    if isinstance(exc, sqlite3.DatabaseError) and "malformed" in text:
        return JournalDamaged(f"{path}: the journal file is damaged ({text}); restore it from a copy")
    if "Could not decode to UTF-8" in text:
        # effectlog writes only UTF-8 TEXT (Python's str cannot hold anything else): such a column was
        # rewritten from outside, damage for verify to name, not a bad argument.
        return CorruptEvent(f"{path}: a stored column is TEXT that is not UTF-8 ({text}); the journal was changed")
    if "readonly" in text or "read-only" in text:
        return StorageError(f"{path}: journal is read-only ({text})")
    if "full" in text:
        return StorageError(f"{path}: disk full while writing the journal ({text})")
    if getattr(exc, "sqlite_errorname", "") == "SQLITE_IOERR_WRITE":  # e.g. a file size limit (EFBIG)
        return StorageError(f"{path}: the journal could not be written ({text}); the write was not committed")
    return StorageError(f"{path}: {text}")


def file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
