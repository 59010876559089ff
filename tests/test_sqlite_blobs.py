"""The SQLite journal binds an event's body and hash as ``bytearray`` (issue 18, hot path): Python's
``sqlite3`` looks every ``bytes`` parameter up in its adapter registry (failed attribute lookups
whose error messages are formatted and dropped), which ``bytearray`` skips. What is stored must not
change: BLOBs holding the canonical bytes and their chain hashes, read back as ``bytes``."""

from __future__ import annotations

from pathlib import Path

import journal_tamper
from effectlog import events as ev
from effectlog.chain import GENESIS, Chain
from effectlog.journal import SqliteJournal


def test_bodies_and_hashes_are_stored_as_blobs_of_the_canonical_bytes(tmp_path: Path) -> None:
    """Each row's body is a BLOB equal to ``events.encode(event)`` and its hash a BLOB equal to the
    chain link over it; ``append`` returns them as ``bytes``, and ``read`` gives the same records."""
    path = tmp_path / "j.db"
    batch: list[ev.Event] = [
        ev.RunStarted(run_id="r", seq=1, ts=1),
        ev.StepRequested(run_id="r", seq=2, ts=2, step_id="s", adapter="a", idempotency_key="k", args_digest="d"),
        ev.StepEffected(run_id="r", seq=3, ts=3, step_id="s", receipt={"b": "x"}),
    ]
    with SqliteJournal(path) as journal:
        claim = journal.claim("r")
        written = journal.append(batch[:1]) + journal.append(batch[1:])
        read = list(journal.read("r"))
        journal.release(claim)
    head, expected = GENESIS, []
    for event in batch:
        body = ev.encode(event)
        head = Chain().link(head, body)
        expected.append(("blob", "blob", body, head))
    with journal_tamper.connect(path) as db:
        stored = db.execute("SELECT typeof(body), typeof(hash), body, hash FROM ev ORDER BY seq").fetchall()
    assert expected == stored
    assert [(bytes, bytes)] * 3 == [(type(r.body), type(r.hash)) for r in written]
    assert [(r.seq, r.body, r.hash) for r in written] == [(r.seq, r.body, r.hash) for r in read]
