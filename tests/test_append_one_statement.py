"""The SQLite owner's plain batches go out as one INSERT statement in autocommit (``_append_owned``):
the same rows, the same chain, the same refusals, atomic, and safe between racing processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from effectlog import events as ev
from effectlog.chain import Chain
from effectlog.errors import EventConflict
from effectlog.fold import replay_records
from effectlog.journal import SqliteJournal
from effectlog.testing import sample_run


def _statements(journal: SqliteJournal) -> list[str]:
    seen: list[str] = []
    journal._db.set_trace_callback(seen.append)
    return seen


def test_a_plain_batch_is_one_statement_and_reads_back_as_written(tmp_path: Path) -> None:
    """After the claim's first append (which names the owner in an explicit transaction), a batch of
    the owner's next events is exactly one statement (no BEGIN, no COMMIT), and the journal reads back
    the encoded events with a chain that verifies."""
    history = sample_run("r", steps=3)
    with SqliteJournal(tmp_path / "j.db") as journal:
        journal.claim("r")
        journal.append(history[:2])
        seen = _statements(journal)
        journal.append(history[2:4])
        journal._db.set_trace_callback(None)
        assert 1 == len(seen)
        assert seen[0].startswith("INSERT INTO events")
        assert 2 == seen[0].count("(1 << 32 | ")  # two rows of run r (schema v2: its number, 1, in the rowid)
        journal.append(history[4:])
        stored = list(journal.read("r"))
        assert [ev.encode(e) for e in history] == [r.body for r in stored]
        assert history[-1].seq == replay_records(stored, Chain(), run_id="r").seq


def test_a_duplicate_in_a_plain_batch_writes_nothing_and_is_named_as_before(tmp_path: Path) -> None:
    """A batch whose second row repeats a recorded (step, phase, attempt) is refused whole: the first
    row is not written either (one statement, rolled back), the refusal names the recorded row as the
    explicit transaction did, and the run's next legal batch is appended after it."""
    history = sample_run("r", steps=2)
    with SqliteJournal(tmp_path / "j.db") as journal:
        journal.claim("r")
        journal.append(history[:2])  # run.started, step.requested s0 (seq 2)
        again = ev.StepRequested(
            run_id="r", seq=4, ts=1, step_id="s0", adapter="a", idempotency_key="k0", args_digest="x"
        )
        with pytest.raises(EventConflict) as refused:
            journal.append([history[2], again])
        assert (4, "step.requested for attempt 1 is already recorded at seq 2") == (
            refused.value.seq,
            refused.value.message,
        )
        assert [1, 2] == [r.seq for r in journal.read("r")]
        journal.append(history[2:4])
        assert [1, 2, 3, 4] == [r.seq for r in journal.read("r")]


# Claims its run, says so, waits for "go", then appends its history two events at a time and tries to
# claim the other process's run half-way (which must be refused: its owner is alive and holds it), says
# what happened, and keeps its own claim until told "close" (so the other's try never meets a run whose
# owner already finished and let go, which a loaded machine made happen).
RACER = """
import os, sys
from effectlog.errors import RunOwned
from effectlog.journal import SqliteJournal
from effectlog.testing import sample_run

path, mine, theirs = sys.argv[1:4]
journal = SqliteJournal(path)
journal.claim(mine)
history = sample_run(mine, steps=300, ts=lambda: os.getpid())
journal.append(history[:1])
print("claimed", flush=True)
sys.stdin.readline()
refused = False
for i in range(1, len(history), 2):
    journal.append(history[i:i + 2])
    if i == 301:
        try:
            journal.claim(theirs)
        except RunOwned:
            refused = True
print("refused" if refused else "TAKEN", flush=True)
sys.stdin.readline()
journal.close()
"""


def test_two_processes_appending_plain_batches_at_once_lose_nothing_and_never_share_a_run(tmp_path: Path) -> None:
    """Two processes append 902 events each to their own runs of one journal at the same time, two
    events per statement: every event of both lands once, in order, with a chain that verifies, and
    neither process can claim the other's run while its owner appends."""
    path = tmp_path / "j.db"
    SqliteJournal(path).close()
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(path), mine, theirs],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for mine, theirs in (("a", "b"), ("b", "a"))
    ]
    for racer in racers:
        assert racer.stdout is not None
        assert "claimed" == racer.stdout.readline().strip()
    for racer in racers:
        assert racer.stdin is not None
        racer.stdin.write("go\n")
        racer.stdin.flush()
    said = []
    for racer in racers:
        assert racer.stdout is not None
        said.append(racer.stdout.readline().strip())
    for racer in racers:
        racer.communicate("close\n", timeout=120)
    assert ["refused", "refused"] == said
    with SqliteJournal(path, writer=False) as journal:
        for run_id in ("a", "b"):
            stored = list(journal.read(run_id))
            assert list(range(1, 903)) == [r.seq for r in stored]
            assert 902 == replay_records(stored, Chain(), run_id=run_id).seq
