"""Sessions on the PostgreSQL journal: the same store API through JournalCheckpointer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from effectlog.journal import open_journal
from effectlog.session import Decision, JournalCheckpointer, Session, ToolCall
from session_kit import count, drive, scripted

pytest_plugins = ["pg_fixture"]
pytestmark = pytest.mark.postgres

RUN = "run-pg"


def hold(c: ToolCall) -> Decision:
    return "require_approval" if c.tool == "transfer" else "allow"


def test_a_session_suspends_resumes_and_closes_on_postgres(pg_url: str, tmp_path: Path) -> None:
    """Held, approved through the store, resumed by another connection: the transfer runs once; pass three is free."""
    calls = tmp_path / "calls.log"
    kinds: list[list[str]] = []
    for approve_first in (False, True, False):
        with JournalCheckpointer(open_journal(pg_url)) as store:
            if approve_first:
                store.approve(RUN, "step-1", by="alice")
            steps = asyncio.run(drive(Session(RUN, scripted(calls), store, policy=hold)))
            kinds.append([type(s).__name__ for s in steps])
    assert [
        ["ModelStep", "ToolStep", "ApprovalStep"],
        ["ModelStep", "ToolStep", "ModelStep", "FinalStep"],
        ["FinalStep"],
    ] == kinds
    assert (2, 1) == (count(calls, "model"), count(calls, "transfer"))
    with JournalCheckpointer(open_journal(pg_url, writer=False)) as store:
        timeline = store.load(RUN)
    assert ("completed", "sent 5 to bob") == (timeline.state, timeline.result)
