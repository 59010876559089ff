"""The fleet contract suite on SQLite, and the journal contract on the fleet's multi-writer SQLite journal."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from effectlog.fleet.contract import FleetContract
from effectlog.fleet.sqlite_journal import SQLITE, FleetSqliteJournal
from effectlog.fleet.sqlite_store import SqliteFleetStore
from effectlog.journal import SqliteJournal
from effectlog.testing import JournalContract


class SqliteFleetBackend:
    """Stores on one file; ``raw_sql`` goes straight to SQLite."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def open(self) -> SqliteFleetStore:
        return SqliteFleetStore(self.path)

    def raw_sql(self, sql: str) -> Any:
        with sqlite3.connect(self.path) as db:
            cur = db.execute(SQLITE.sql(sql))
            return cur.fetchall()


class TestSqliteFleet(FleetContract):
    @pytest.fixture
    def fleet_backend(self, tmp_path: Path) -> SqliteFleetBackend:
        return SqliteFleetBackend(tmp_path / "fleet.db")


class JournalBackend:
    def __init__(self, path: Path) -> None:
        self.path = path

    def open(self) -> FleetSqliteJournal:
        return FleetSqliteJournal(self.path)

    def raw_sql(self, sql: str) -> Any:
        with sqlite3.connect(self.path) as db:
            return db.execute(sql).fetchall()


class TestFleetSqliteJournal(JournalContract):
    """The fleet's journal (no file lock, heads read in each transaction) keeps every journal guarantee."""

    @pytest.fixture
    def backend(self, tmp_path: Path) -> JournalBackend:
        return JournalBackend(tmp_path / "fleet.db")


def test_the_store_file_is_an_ordinary_journal_too(tmp_path: Path) -> None:
    """`effectlog verify|status|reconcile --journal STORE` open the store file as a plain SqliteJournal."""
    from effectlog.fleet.contract import started

    path = tmp_path / "fleet.db"
    with SqliteFleetStore(path) as store:
        store.journal().append([started("run-1")])
    plain = SqliteJournal(path, writer=True)
    try:
        assert ["run-1"] == plain.runs()
        assert 1 == plain.head("run-1")[0]
    finally:
        plain.close()
    with SqliteFleetStore(path) as store:  # and the store still opens after the plain journal added its tables
        assert ["run-1"] == store.journal().runs()


def test_a_new_store_file_is_private(tmp_path: Path) -> None:
    """The store holds plans (and their secrets): it is created readable by its owner only."""
    path = tmp_path / "fleet.db"
    SqliteFleetStore(path).close()
    assert 0o600 == path.stat().st_mode & 0o777


def test_a_v1_store_is_migrated_and_its_requests_get_the_default_requeue_policy(tmp_path: Path) -> None:
    """A store written before requeue limits (fleet schema v1, a queued request in it) opens, is migrated to
    the current version, and its request gets the default limit and no backoff."""
    from effectlog.fleet import limits
    from effectlog.fleet.sqlite_store import DDL, FLEET_SCHEMA_VERSION

    path = tmp_path / "fleet.db"
    FleetSqliteJournal(path).close()
    with sqlite3.connect(path) as db:
        for sql in DDL:
            db.execute(sql)
        db.execute("INSERT INTO meta (key, value) VALUES ('fleet_schema_version', '1')")
        db.execute(
            "INSERT INTO fleet_requests (scope, idem_key, fingerprint, run_id, plan, requires, created_at,"
            " current_attempt) VALUES ('s', 'k', 'f', 'run-old', '{}', '[]', 1.0, 1)"
        )
        db.execute(
            "INSERT INTO fleet_attempts (request_id, attempt_no, state, created_at) VALUES (1, 1, 'queued', 1.0)"
        )
    with SqliteFleetStore(path) as store:
        view = store.request(1)
        assert (limits.DEFAULT_MAX_REQUEUES, 0, None) == (view.max_requeues, view.requeues, view.not_before)
        assert [(1, True)] == [(c.request_id, c.due) for c in store.candidates(10)]
    with sqlite3.connect(path) as db:
        assert [(str(FLEET_SCHEMA_VERSION),)] == db.execute(
            "SELECT value FROM meta WHERE key = 'fleet_schema_version'"
        ).fetchall()
