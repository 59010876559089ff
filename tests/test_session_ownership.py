"""Sessions own their run only while a pass writes it (issue 11): an application that keeps its store
open no longer blocks the CLI's decisions, and two passes of one run never both write it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from effectlog.errors import EventConflict, RunOwned
from effectlog.session import Session, SqliteCheckpointer, ToolCall
from session_kit import count, drive, scripted

RUN = "run-1"


def hold_transfers(c: ToolCall) -> Any:
    return "require_approval" if c.tool == "transfer" else "allow"


def test_the_cli_approves_a_held_session_while_the_application_keeps_its_store_open(tmp_path: Path) -> None:
    """The app's pass suspends on a held call and keeps its store open; `effectlog approve` in another
    process succeeds (the pass released the run when it stopped), and the next pass runs the tool once."""
    journal = tmp_path / "runs.db"
    with SqliteCheckpointer(journal) as store:
        asyncio.run(drive(Session(RUN, scripted(tmp_path / "calls.log"), store, policy=hold_transfers)))
        done = subprocess.run(
            [sys.executable, "-m", "effectlog", "approve", "--journal", str(journal), "--run-id", RUN,
             "--step", "step-1", "--by", "alice"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert (0, "") == (done.returncode, done.stderr)
        asyncio.run(drive(Session(RUN, scripted(tmp_path / "calls.log"), store, policy=hold_transfers)))
        assert "completed" == store.state(RUN).state
    assert 1 == count(tmp_path / "calls.log", "transfer")


def test_a_second_pass_of_one_run_cannot_write_while_the_first_owns_it(tmp_path: Path) -> None:
    """Two passes of one run in one process: the first writes (and owns the run until it waits or ends);
    the second's first write is refused (RunOwned) and nothing it prepared is recorded."""
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        first = Session(RUN, scripted(tmp_path / "a.log"), store)
        second = Session(RUN, scripted(tmp_path / "b.log"), store)
        asyncio.run(first.tool("lookup", {"name": "ada"}))  # the first pass writes: it owns the run now
        written = store.state(RUN).seq
        with pytest.raises(RunOwned):
            asyncio.run(second.tool("lookup", {"name": "bob"}))
        assert written == store.state(RUN).seq
        first.release()
        with pytest.raises(EventConflict):  # free now, but it read the run before the first pass wrote
            asyncio.run(second.tool("lookup", {"name": "bob"}))
        assert written == store.state(RUN).seq
    assert (1, 0) == (count(tmp_path / "a.log", "lookup"), count(tmp_path / "b.log", "lookup"))
