"""The SQLite claim picks the oldest fitting queued request through an index, not by sorting every queued row
inside the file's one write transaction (the cost that grew with runner processes: each one's page cache is
stale after another's commit, so every claim re-read every queued row)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from effectlog.fleet import open_store
from effectlog.fleet.contract import noop_plan
from effectlog.fleet.sqlite_journal import SQLITE
from effectlog.fleet.sqlstore import _PICK


def _plan(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        rows = db.execute("EXPLAIN QUERY PLAN " + SQLITE.sql(_PICK + " {claim}"), (0.0, "[]", 1)).fetchall()
    return [str(r[3]) for r in rows]


def test_the_claims_pick_walks_the_queue_index_without_sorting(tmp_path: Path) -> None:
    """SQLite's plan for the pick searches the (state, request_id) index and uses no temporary sort."""
    path = tmp_path / "fleet.db"
    open_store(str(path)).close()
    plan = _plan(path)
    assert "SEARCH a USING INDEX fleet_attempts_queue (state=?)" == plan[0], plan
    assert [] == [step for step in plan if "TEMP B-TREE" in step]


def test_a_store_without_the_queue_index_gets_it_when_opened_and_claims_oldest_first(tmp_path: Path) -> None:
    """A store made before the index (dropped here) gets it back at the next open, and claims still take the
    oldest queued request first."""
    path = tmp_path / "fleet.db"
    with open_store(str(path)) as store:
        for i in range(3):
            store.submit("s", f"k{i}", noop_plan(f"run-{i}"))
    with sqlite3.connect(path) as db:
        db.execute("DROP INDEX fleet_attempts_queue")
    assert "TEMP B-TREE" in " ".join(_plan(path))
    with open_store(str(path)) as store:
        assert [1, 2, 3] == [store.claim_next(f"r{i}", [], 60.0, 1)[0].request_id for i in range(3)]
    assert [] == [step for step in _plan(path) if "TEMP B-TREE" in step]
