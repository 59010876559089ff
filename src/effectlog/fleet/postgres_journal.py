"""The journal inside a PostgreSQL fleet store: the one ``PostgresJournal``, appends fenced by a lease.

The runs' journal lives in the same database as the fleet tables, so a fenced append
is ONE transaction (``PostgresJournal.append_under`` with a ``LeaseFence``): the run's
advisory lock, then ONE statement that checks the lease (with the idempotency look-up
and the database's clock), records the operation and inserts the events chained onto
the head the journal last committed (a stale head fails on the primary key and the
append is redone with the head read under the lock), then any carried transitions.
The recovery service takes the same run lock before it locks the attempt row ``FOR
UPDATE`` and reads the journal, so it either sees the append or the append sees the
lease gone; never half of each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from effectlog.events import Event
from effectlog.fleet.fencing import Carry, Dialect, LeaseFence
from effectlog.fleet.model import Lease
from effectlog.fold import Record
from effectlog.journal.postgres import PostgresJournal
from effectlog.journal.postgres_schema import SCHEMA, translate

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
    writable_cte=True,
    # Every locking query names the attempts table `a`.
    locks={
        # A fenced append's lease check locks no row: every append holds its run's advisory lock
        # (RUN_LOCK_CLASS) for its transaction, and the recovery service takes that lock before
        # it locks the attempt and reads the journal, so it sees the append or the append sees
        # the lease gone. A row lock here would write WAL (a lock record) for every append.
        "share": "",
        "update": "FOR UPDATE OF a",
        # The store's clock in a query: the database's, as PgTx.now.
        "clock": "extract(epoch FROM clock_timestamp())::float8",
        "claim": "FOR UPDATE OF a SKIP LOCKED",
        # A request fits when its requirements (a JSON array) are contained in the offer.
        "fits": "r.requires::jsonb <@ ?::jsonb",
    },
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
    """The one PostgreSQL journal, plus appends fenced by a lease (``LeaseFence``) in the append's transaction."""

    def append_fenced(self, events: Sequence[Event], lease: Lease | None, carry: Carry | None = None) -> list[Record]:
        if lease is None:
            return self.append(events)  # not under a lease: an operator's or a plain writer's batch
        return self.append_under(events, LeaseFence(lease, POSTGRES, PgTx, carry))
