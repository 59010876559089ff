"""`effectlog verify` on a real journal file, run as a real subprocess.

The tampering test flips one byte of one stored event body in the SQLite file
itself, with plain file I/O after a WAL checkpoint: the append-only triggers stay in
place, exactly as an accidental corruption (or a careless edit) would meet them.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from effectlog import events as ev
from effectlog.journal import SqliteJournal, load_run
from effectlog.testing import sample_run

RUNS = {"run-a": sample_run("run-a", steps=2), "run-b": sample_run("run-b", steps=3)}


def effectlog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectlog", *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    """A real journal file holding run-a (8 events) and run-b (11 events), all of it in the main file."""
    path = tmp_path / "journal.db"
    with SqliteJournal(path) as j:
        for history in RUNS.values():
            j.append(history)
    db = sqlite3.connect(path)
    try:
        assert 0 == db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]  # 0: not blocked
    finally:
        db.close()
    wal = path.with_name(path.name + "-wal")
    assert not wal.exists() or 0 == wal.stat().st_size  # every event's bytes are in journal.db now
    return path


def flip_one_byte(path: Path, body: bytes, offset: int) -> None:
    """Flip the bits of byte ``offset`` of ``body`` where the file stores it (exactly once)."""
    data = path.read_bytes()
    assert 1 == data.count(body)
    at = data.index(body) + offset
    with path.open("r+b") as fh:
        fh.seek(at)
        fh.write(bytes([data[at] ^ 0xFF]))


def head_of(path: Path, run_id: str) -> str:
    with SqliteJournal(path, writer=False) as j:
        return load_run(j, run_id).head.hex()


def test_verify_of_an_intact_journal_exits_0(journal: Path) -> None:
    """Every run replays with chain, sequence and transitions intact: exit 0 and a one-line summary."""
    result = effectlog("verify", "--journal", str(journal))
    assert (0, "ok: 2 run(s), 19 event(s) verified\n", "") == (result.returncode, result.stdout, result.stderr)


def test_verify_json_of_an_intact_journal(journal: Path) -> None:
    """--json reports each run's event count, state and chain head."""
    result = effectlog("verify", "--journal", str(journal), "--json")
    expected = {
        "ok": True,
        "error": None,
        "runs": [
            {"run_id": run_id, "events": len(history), "state": "completed", "head": head_of(journal, run_id)}
            for run_id, history in RUNS.items()
        ],
    }
    assert (0, expected) == (result.returncode, json.loads(result.stdout))


@pytest.mark.parametrize(
    ("run_id", "seq"),
    [("run-a", 1), ("run-b", 6), ("run-b", 11)],
    ids=["first event", "middle event", "last event"],
)
@pytest.mark.parametrize("where", ["first byte", "middle byte", "last byte"])
def test_one_flipped_byte_exits_7_naming_run_and_seq(journal: Path, run_id: str, seq: int, where: str) -> None:
    """Flipping one byte of one stored event body in the file makes verify exit 7 naming that run and seq."""
    body = ev.encode(RUNS[run_id][seq - 1])
    offset = {"first byte": 0, "middle byte": len(body) // 2, "last byte": len(body) - 1}[where]
    flip_one_byte(journal, body, offset)
    result = effectlog("verify", "--journal", str(journal))
    assert 7 == result.returncode
    assert result.stderr.startswith(f"effectlog: chain_broken: run '{run_id}', seq {seq}: "), result.stderr
    assert "" == result.stdout


def test_flipped_byte_in_json_output(journal: Path) -> None:
    """--json names the broken run and seq, and lists the runs verified before it."""
    run_a_head = head_of(journal, "run-a")
    flip_one_byte(journal, ev.encode(RUNS["run-b"][4]), 10)
    result = effectlog("verify", "--journal", str(journal), "--json")
    report = json.loads(result.stdout)
    assert 7 == result.returncode
    assert (False, [{"run_id": "run-a", "events": 8, "state": "completed", "head": run_a_head}]) == (
        report["ok"],
        report["runs"],
    )
    assert ("chain_broken", "run-b", 5, None) == (
        report["error"]["code"],
        report["error"]["run_id"],
        report["error"]["seq"],
        report["error"]["step_id"],
    )
    assert result.stderr.startswith("effectlog: chain_broken: run 'run-b', seq 5: ")


def test_verify_of_one_run_ignores_damage_elsewhere(journal: Path) -> None:
    """--run-id verifies only that run: run-a passes although run-b is damaged."""
    flip_one_byte(journal, ev.encode(RUNS["run-b"][2]), 3)
    result = effectlog("verify", "--journal", str(journal), "--run-id", "run-a")
    assert (0, "ok: 1 run(s), 8 event(s) verified\n") == (result.returncode, result.stdout)
    assert 7 == effectlog("verify", "--journal", str(journal), "--run-id", "run-b").returncode


def test_unknown_run_id_exits_2(journal: Path) -> None:
    """--run-id of a run the journal does not hold is bad input (exit 2), said in one line."""
    result = effectlog("verify", "--journal", str(journal), "--run-id", "nope")
    expected = f"effectlog: unknown_run: no run 'nope' in {journal}\n"
    assert (2, "", expected) == (result.returncode, result.stdout, result.stderr)


def test_missing_journal_exits_2(tmp_path: Path) -> None:
    """verify never creates a journal: a missing file is bad input."""
    result = effectlog("verify", "--journal", str(tmp_path / "absent.db"))
    assert 2 == result.returncode
    assert result.stderr.startswith("effectlog: journal_unreadable: ")
    assert not (tmp_path / "absent.db").exists()
