"""The SQLite journal reads a run page by page; paging never drops, repeats or reorders a row."""

from __future__ import annotations

from pathlib import Path

import pytest

import journal_tamper
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


def test_a_read_record_carries_every_index_column_as_stored(tmp_path: Path) -> None:
    """The run_id column is not read back (the query fixes it): a record still carries the run id asked
    for, and the step_id, phase and attempt columns as stored, which the replay compares with the body."""
    history = sample_run("cols", steps=2)
    with SqliteJournal(tmp_path / "j.db") as journal:
        journal.append(history)
        stored = (
            journal_tamper.connect(tmp_path / "j.db")
            .execute("SELECT run_id, seq, step_id, phase, attempt FROM ev WHERE run_id = 'cols' ORDER BY seq")
            .fetchall()
        )
        got = [(r.run_id, r.seq, r.step_id, r.phase, r.attempt) for r in journal.read("cols")]
    assert stored == got


@pytest.mark.parametrize(
    "run_ids",
    [
        [],
        ["only"],
        ["b", "a", "c"],
        ["run-10", "run-9", "run-1", "Run", "rün", "r", "r-"],
        [f"r{i}" for i in range(50)],
    ],
)
def test_runs_lists_what_select_distinct_lists_in_the_same_order(tmp_path: Path, run_ids: list[str]) -> None:
    """``runs()`` (one seek per run instead of a scan of every event) gives the ids ``SELECT DISTINCT
    run_id ... ORDER BY run_id`` gives, in the same order, whatever the ids and their count."""
    with SqliteJournal(tmp_path / "j.db") as journal:
        for run_id in run_ids:
            journal.append(sample_run(run_id, steps=1))
        tamper = journal_tamper.connect(tmp_path / "j.db")
        expected = [r[0] for r in tamper.execute("SELECT DISTINCT run_id FROM ev ORDER BY run_id")]
        tamper.close()
        assert sorted(run_ids) == expected
        assert expected == journal.runs()
