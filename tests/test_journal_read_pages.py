"""The SQLite journal reads a run page by page; paging never drops, repeats or reorders a row."""

from __future__ import annotations

from pathlib import Path

import pytest

from effectlog import events as ev
from effectlog.journal import SqliteJournal, load_run
from effectlog.journal import sqlite as sqlite_journal
from effectlog.testing import sample_run


@pytest.mark.parametrize("page", [1, 2, 4, 8, 100])
@pytest.mark.parametrize("after_seq", [0, 1, 3, 8])
def test_paged_reads_return_every_row_once_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, page: int, after_seq: int
) -> None:
    """Whatever the page size (smaller, equal to, a divisor of, or larger than the run), a read
    returns exactly the rows after ``after_seq``, byte for byte, in seq order."""
    monkeypatch.setattr(sqlite_journal, "READ_PAGE_ROWS", page)
    history = sample_run("paged", steps=2)  # 8 events
    with SqliteJournal(tmp_path / "j.db") as journal:
        journal.append(history)
        journal.append(sample_run("other", steps=1))  # another run's rows must not leak in
        got = list(journal.read("paged", after_seq=after_seq))
        assert [ev.encode(e) for e in history[after_seq:]] == [r.body for r in got]
        assert list(range(after_seq + 1, len(history) + 1)) == [r.seq for r in got]
        assert len(history) == load_run(journal, "paged").seq
