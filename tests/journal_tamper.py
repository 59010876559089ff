"""Tampering with a SQLite journal's events as an attacker with the file would, in the columns tests name.

The journal's schema v2 keeps each event at rowid ``run << 32 | seq`` with the run's id in ``runs``
(``effectlog.journal.sqlite_schema``). ``rows(db)`` adds, on this connection only (``TEMP``), a view
``ev`` with the columns of the v1 table, ``(run_id, seq, step_id, phase, attempt, body, hash)``, whose
``UPDATE``, ``DELETE`` and ``INSERT`` change the real rows underneath: the same edit a test made to v1's
table, so what each test proves is unchanged. The journal's own append-only triggers still fire:
a test drops them first, as before.
"""

from __future__ import annotations

import sqlite3
from typing import Any

VIEW = "ev"

_DDL = (
    "CREATE TEMP VIEW IF NOT EXISTS ev AS SELECT n.run_id AS run_id, e.id & 4294967295 AS seq, e.step_id AS step_id,"
    " e.phase AS phase, e.attempt AS attempt, e.body AS body, e.hash AS hash, e.id AS id"
    " FROM events e JOIN runs n ON n.run = e.id >> 32",
    """CREATE TEMP TRIGGER IF NOT EXISTS ev_update INSTEAD OF UPDATE ON ev BEGIN
        INSERT OR IGNORE INTO runs (run_id) VALUES (NEW.run_id);
        UPDATE events SET id = (SELECT run FROM runs WHERE run_id = NEW.run_id) << 32 | NEW.seq,
            run = (SELECT run FROM runs WHERE run_id = NEW.run_id), step_id = NEW.step_id, phase = NEW.phase,
            attempt = NEW.attempt, body = NEW.body, hash = NEW.hash
        WHERE id = OLD.id;
    END""",
    """CREATE TEMP TRIGGER IF NOT EXISTS ev_delete INSTEAD OF DELETE ON ev BEGIN
        DELETE FROM events WHERE id = OLD.id;
    END""",
    """CREATE TEMP TRIGGER IF NOT EXISTS ev_insert INSTEAD OF INSERT ON ev BEGIN
        INSERT OR IGNORE INTO runs (run_id) VALUES (NEW.run_id);
        INSERT INTO events (id, run, step_id, phase, attempt, body, hash) VALUES (
            (SELECT run FROM runs WHERE run_id = NEW.run_id) << 32 | NEW.seq,
            (SELECT run FROM runs WHERE run_id = NEW.run_id), NEW.step_id, NEW.phase, NEW.attempt, NEW.body, NEW.hash);
    END""",
)


def rows(db: sqlite3.Connection) -> sqlite3.Connection:
    """``db`` with the view ``ev`` over the journal's events (see the module's docstring), when the file is a
    journal; returns ``db``."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'runs'").fetchone() is None:
        return db
    for sql in _DDL:
        db.execute(sql)
    return db


def connect(path: object, **kwargs: Any) -> sqlite3.Connection:
    """A plain connection to the journal file (``sqlite3.connect``'s arguments) with ``ev`` on it."""
    return rows(sqlite3.connect(str(path), **kwargs))
