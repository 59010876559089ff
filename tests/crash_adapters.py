"""User-style adapters for the crash matrix's "bring your own adapter" mode.

Both keep their own ledger in the SQLite file named by ``EFFECTLOG_TEST_LEDGER``:
``keeps_contract`` stores effect and key in one transaction (a real idempotency
contract); ``declares_but_duplicates`` only *declares* idempotency and writes an
effect on every call, which the matrix must expose.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

_SCHEMA = "CREATE TABLE IF NOT EXISTS ledger (key TEXT, run_id TEXT, step_id TEXT)"


def _db() -> sqlite3.Connection:
    db = sqlite3.connect(os.environ["EFFECTLOG_TEST_LEDGER"], isolation_level=None, timeout=30)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = FULL")
    db.execute(_SCHEMA)
    return db


class KeepsContract:
    def invoke(self, request: Any) -> dict[str, Any]:
        db = _db()
        try:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT rowid FROM ledger WHERE key = ?", (request.idempotency_key,)).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO ledger VALUES (?, ?, ?)", (request.idempotency_key, request.run_id, request.step_id)
                )
            db.execute("COMMIT")
        finally:
            db.close()
        return {"key": request.idempotency_key}


class DeclaresButDuplicates:
    def invoke(self, request: Any) -> dict[str, Any]:
        db = _db()
        try:
            db.execute(
                "INSERT INTO ledger VALUES (?, ?, ?)", (request.idempotency_key, request.run_id, request.step_id)
            )
        finally:
            db.close()
        return {"key": request.idempotency_key}


def keeps_contract(decl: Any, context: Any) -> KeepsContract:
    return KeepsContract()


def declares_but_duplicates(decl: Any, context: Any) -> DeclaresButDuplicates:
    return DeclaresButDuplicates()


def count(run_id: str, step_id: str) -> int:
    db = _db()
    try:
        return int(
            db.execute("SELECT COUNT(*) FROM ledger WHERE run_id = ? AND step_id = ?", (run_id, step_id)).fetchone()[0]
        )
    finally:
        db.close()
