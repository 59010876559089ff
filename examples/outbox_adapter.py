"""An adapter that keeps its own ledger and can be asked about it: a mail outbox.

Mail cannot be un-sent and SMTP has no idempotency key, so this tool is declared
``"idempotent": false``: after a crash between sending and recording the receipt,
effectlog stops the run on an *uncertain* step instead of sending twice. The
adapter's ``lookup`` then answers from the adapter's own records, and

    effectlog reconcile --journal J --run-id R --step S --lookup --adapters outbox_adapter:ADAPTERS

records that answer (``automated: true``, with this adapter's identity) so the next
resume either counts the step as done or sends it again under a new key.

The ledger is a transactional outbox: ``invoke`` commits one row per message in a
single SQLite transaction and a relay (not shown) delivers committed rows. So a row
exists if and only if the message goes out, which is what makes ``lookup``'s
"not applied" definite. A plan names the ledger file in the adapter's options::

    "adapters": {"mail": {"type": "example.outbox", "version": "1", "idempotent": false,
                          "options": {"ledger": "outbox.db"}}}

The outbox belongs to the application and exists before any run uses it
(``create_ledger``): ``lookup`` answers ``None`` ("cannot tell") when it finds no
outbox at all, rather than "not sent" from the wrong directory. Plans without
options (the crash matrix's) name the file in the ``OUTBOX_LEDGER`` environment
variable::

    effectlog crash-matrix run --output report.json --adapter outbox_adapter:factory \
        --ledger outbox_adapter:count --not-idempotent \
        --args '{"to": "ada@example.com", "subject": "Welcome"}'
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from effectlog.adapters import Evidence, Receipt, Request, body_digest
from effectlog.errors import NotApplied

_SCHEMA = """CREATE TABLE IF NOT EXISTS outbox (
    message_id INTEGER PRIMARY KEY,
    idempotency_key TEXT NOT NULL,
    run_id TEXT NOT NULL,
    step_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    body_digest TEXT NOT NULL,
    recipient TEXT NOT NULL,
    subject TEXT NOT NULL,
    queued_ns INTEGER NOT NULL
)"""


def create_ledger(path: str) -> None:
    """Create the outbox (the application does this once, before any run uses it)."""
    db = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute(_SCHEMA)
    finally:
        db.close()


def ledger_path(options: dict[str, Any] | None = None) -> str:
    return str((options or {}).get("ledger") or os.environ.get("OUTBOX_LEDGER") or "outbox.db")


class Outbox:
    """``example.outbox``: queues one message per call (no deduplication: mail has none)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = FULL")
        db.execute(_SCHEMA)
        return db

    def invoke(self, request: Request) -> Receipt:
        args = request.args
        if not isinstance(args.get("to"), str) or "@" not in args["to"]:
            raise NotApplied(f"'to' must be an e-mail address, got {args.get('to')!r}")  # refused: nothing queued
        db = self._db()
        try:
            cur = db.execute(
                "INSERT INTO outbox (idempotency_key, run_id, step_id, attempt, body_digest, recipient, subject,"
                " queued_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    request.idempotency_key,
                    request.run_id,
                    request.step_id,
                    request.attempt,
                    body_digest(request),
                    args["to"],
                    str(args.get("subject", "")),
                    time.time_ns(),
                ),
            )
            message_id = cur.lastrowid
        finally:
            db.close()
        return Receipt(data={"message_id": message_id})

    def lookup(self, request: Request) -> Evidence | None:
        """Is this attempt's message in the outbox? ``None`` when the outbox cannot tell."""
        if not Path(self.path).is_file():
            return None  # no ledger here at all: maybe the wrong directory; never guess "not sent"
        db = sqlite3.connect(f"file:{os.path.abspath(self.path)}?mode=ro", uri=True, timeout=30)
        try:
            rows = db.execute(
                "SELECT message_id, body_digest FROM outbox WHERE idempotency_key = ? ORDER BY message_id",
                (request.idempotency_key,),
            ).fetchall()
        except sqlite3.Error:
            return None  # not an outbox, or unreadable: cannot tell
        finally:
            db.close()
        if not rows:
            return Evidence(applied=False, detail=f"outbox {self.path}: no message queued under this key")
        ours = [r for r in rows if r[1] == body_digest(request)]
        if not ours:
            return None  # the key holds another request's body: this is not evidence about ours
        ids = ", ".join(f"#{r[0]}" for r in ours)
        return Evidence(applied=True, detail=f"outbox {self.path}: message {ids} queued under this key")


def factory(decl: Any, context: Any) -> Outbox:
    return Outbox(ledger_path(getattr(decl, "options", None)))


ADAPTERS = {"example.outbox": factory}


def count(run_id: str, step_id: str) -> int:
    """Messages in the outbox for one step of one run: the crash matrix's ledger counter."""
    path = ledger_path()
    if not Path(path).is_file():
        return 0
    db = sqlite3.connect(path, timeout=30)
    try:
        found = db.execute(
            "SELECT count(*) FROM outbox WHERE run_id = ? AND step_id = ?", (run_id, step_id)
        ).fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()
    return int(found)
