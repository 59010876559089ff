"""The journal inside a PostgreSQL fleet store: ``PostgresJournal`` plus fenced appends.

The runs' journal lives in the same database as the fleet tables, so a fenced append
is ONE transaction: lock the attempt row ``FOR SHARE`` and check the lease, then the
journal's own append (run lock, head, chain, insert), then the operation record. The
recovery service locks the same row ``FOR UPDATE`` before it reads the journal, so it
either sees the append or the append sees the lease gone; never half of each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import PoolTimeout

from effectlog.errors import EventConflict, StorageError
from effectlog.events import Event, encode
from effectlog.fleet.fencing import Dialect, batch_identity, check_batch_runs, check_lease, record_operation, replayed
from effectlog.fleet.model import Lease
from effectlog.fold import Record
from effectlog.journal.postgres import SCHEMA, PostgresJournal
from effectlog.journal.postgres import _translate as translate

FLEET_SCHEMA = "effectlog_fleet"

POSTGRES = Dialect(
    {
        "requests": f"{FLEET_SCHEMA}.requests",
        "attempts": f"{FLEET_SCHEMA}.attempts",
        "history": f"{FLEET_SCHEMA}.history",
        "operations": f"{FLEET_SCHEMA}.operations",
        "events": f"{SCHEMA}.events",
    },
    placeholder="%s",
    # Every locking query names the attempts table `a`.
    locks={"share": "FOR SHARE OF a", "update": "FOR UPDATE OF a", "claim": "FOR UPDATE OF a SKIP LOCKED"},
)

__all__ = ["FLEET_SCHEMA", "POSTGRES", "FleetPostgresJournal", "PgTx", "translate"]


class PgTx:
    """``effectlog.fleet.sqlstore.Tx`` over a connection inside a transaction; the database's clock."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        row = self.conn.execute(sql, params).fetchone()
        return None if row is None else tuple(row)

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.conn.execute(sql, params).fetchall()]

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return int(self.conn.execute(sql, params).rowcount)

    def now(self) -> float:
        # clock_timestamp(), not now(): now() is frozen at the start of the transaction.
        row = self.conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        return float(row[0])


class FleetPostgresJournal(PostgresJournal):
    """A ``PostgresJournal`` whose ``append_fenced`` checks a lease in the append's own transaction.

    It reuses the journal's private append step (``_append_locked``) so the chain, the
    run lock and the deduplication stay the journal's; the journal contract suite runs
    against this class through ``append_fenced`` to keep that coupling honest.
    """

    def append_fenced(self, events: Sequence[Event], lease: Lease | None) -> list[Record]:
        if lease is None:
            return self.append(events)
        if not self.writer:
            raise StorageError(f"{self.location}: journal opened read-only")
        if not events:
            return []
        check_batch_runs(events, lease)
        encoded = [encode(e) for e in events]
        op_key, body = batch_identity(events, encoded)
        try:
            with self._pool.connection() as conn:
                try:
                    with conn.transaction():
                        tx = PgTx(conn)
                        if replayed(tx, POSTGRES, lease, op_key, body) is not None:
                            return [self._same(conn, e, b) for e, b in zip(events, encoded, strict=True)]
                        now = tx.now()
                        check_lease(tx, POSTGRES, lease, now, lock="share")
                        records = self._append_locked(conn, events)
                        record_operation(tx, POSTGRES, lease, op_key, body_digest=body, result="", now=now)
                        return records
                except pg_errors.UniqueViolation as exc:
                    raise self._unique_conflict(conn, events, exc) from None
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, self.location) from None

    def _same(self, conn: psycopg.Connection[Any], event: Event, body: bytes) -> Record:
        known = self._stored(conn, event.run_id, event.seq)
        if known is None or known.body != body:
            raise EventConflict("a different event is already recorded at this seq", run_id=event.run_id, seq=event.seq)
        return known
