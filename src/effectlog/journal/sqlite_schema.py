"""The SQLite journal's schema and SQL: migrations, derived tables (seals, owners), statements,
and how SQLite's errors read to a user. ``SqliteJournal`` (``effectlog.journal.sqlite``) uses them."""

from __future__ import annotations

import os
import sqlite3
from typing import Literal

from effectlog.errors import CorruptEvent, JournalDamaged, JournalUnreadable, StorageError
from effectlog.journal.protocol import SCHEMA_VERSION

Durability = Literal["full", "normal"]

# Ordered migrations: index i brings schema version i to i + 1.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE events (
            run_id TEXT NOT NULL,
            seq INTEGER NOT NULL CHECK (seq > 0),
            step_id TEXT NOT NULL,
            phase TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            body BLOB NOT NULL,
            hash BLOB NOT NULL,
            PRIMARY KEY (run_id, seq),
            UNIQUE (run_id, step_id, phase, attempt)
        ) WITHOUT ROWID""",
        """CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
           BEGIN SELECT RAISE(ABORT, 'effectlog: events are append-only'); END""",
        """CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
           BEGIN SELECT RAISE(ABORT, 'effectlog: events are append-only'); END""",
    ),
)
assert len(MIGRATIONS) == SCHEMA_VERSION

INSERT = (
    "INSERT INTO events (run_id, seq, step_id, phase, attempt, body, hash) VALUES (?, ?, ?, ?, ?, ?, ?)"
)

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
# ``SELECT DISTINCT run_id FROM events ORDER BY run_id`` without reading every event: one seek in the
# primary key per run. SQLite's DISTINCT scans every event (~0.1 ms per 1,000 events: 10 ms for one run
# of 100k events on every ``verify``, ``status``, ``show``); the seeks cost ~3 us per run, more than the
# scan only when runs average under ~10 events (5,000 runs of 5 events: 14 ms instead of 7), where
# each run's own verify or summary costs far more than either. The same ids in the same order (min and
# > order values as ORDER BY does).
LIST_RUNS = (
    "WITH RECURSIVE r(id) AS (SELECT min(run_id) FROM events UNION ALL "
    "SELECT (SELECT min(run_id) FROM events WHERE run_id > r.id) FROM r WHERE r.id IS NOT NULL) "
    "SELECT id FROM r WHERE id IS NOT NULL"
)
READ_PAGE_ROWS = 2000
# Columns in ``Record``'s field order after ``run_id``, so a page becomes records without a Python loop
# (``starmap`` over ``partial(Record, run_id)``). The run_id column is not read back: ``WHERE run_id = ?``
# (BINARY collation, TEXT to TEXT) returns only rows whose column is exactly the id asked for, so the
# value is known, and one string less per row is about a tenth of a read.
READ_PAGE = (
    "SELECT seq, body, hash, step_id, phase, attempt FROM events WHERE run_id = ? AND seq > ? "
    "ORDER BY seq LIMIT ?"
)
WAL_AUTOCHECKPOINT_PAGES = 8000  # about 32 MiB of WAL between checkpoints (SQLite's default: 1,000 pages)
INSERT_SEAL = "INSERT INTO seals (run_id, seq, body, hash) VALUES (?, ?, ?, ?)"
# One statement, so one snapshot: the seal and the run's last event together.
SELECT_SEAL = (
    "SELECT s.seq, s.body, s.hash, e.seq, e.hash FROM seals s JOIN events e ON e.run_id = s.run_id "
    "WHERE s.run_id = ? ORDER BY e.seq DESC LIMIT 1"
)


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


