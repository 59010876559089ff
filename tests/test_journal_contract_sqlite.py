"""The journal contract suite, run against the SQLite backend."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from effectlog.journal import SqliteJournal
from effectlog.testing import JournalContract


class SqliteBackend:
    def __init__(self, path: Path) -> None:
        self.path = path

    def open(self) -> SqliteJournal:
        return SqliteJournal(self.path)

    def raw_sql(self, sql: str) -> Any:
        db = sqlite3.connect(self.path)
        try:
            with db:
                return db.execute(sql).fetchall()
        finally:
            db.close()


class TestSqliteJournal(JournalContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> SqliteBackend:
        return SqliteBackend(tmp_path / "journal.db")


def test_pragmas_are_wal_and_full(tmp_path: Path) -> None:
    """The writer uses WAL and synchronous=FULL (2) unless told otherwise."""
    j = SqliteJournal(tmp_path / "j.db")
    try:
        assert "wal" == j._db.execute("PRAGMA journal_mode").fetchone()[0]
        assert 2 == j._db.execute("PRAGMA synchronous").fetchone()[0]
    finally:
        j.close()


def test_new_journal_is_private(tmp_path: Path) -> None:
    """A journal file is created with mode 0600."""
    SqliteJournal(tmp_path / "j.db").close()
    assert 0o600 == (tmp_path / "j.db").stat().st_mode & 0o777
