"""The fleet store on SQLite: many runner processes on one host, one file.

Requests, attempts, their history and the runs' journal share one file, so a lease
check and the write it guards are one ``BEGIN IMMEDIATE`` transaction. The database
enforces what the fleet promises: one open attempt per request (partial unique
index), attempts' identity and leases immutable, finished attempts frozen, history
and operation records append-only, a request's cancellation and end recorded once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from effectlog.chain import Chain
from effectlog.errors import BadInput, JournalUnreadable
from effectlog.events import Event
from effectlog.fleet import attempts as am
from effectlog.fleet import limits, wakeups
from effectlog.fleet.fencing import Tx
from effectlog.fleet.leased_journal import LeasedJournal
from effectlog.fleet.model import Lease
from effectlog.fleet.sqlite_journal import SQLITE, Durability, FleetSqliteJournal, SqliteTx, transaction
from effectlog.fleet.sqlstore import SqlFleetStore, _offer

FLEET_SCHEMA_VERSION = 2
_FINAL = am.sql_list(am.FINAL)


def _refuse(name: str, message: str, when: str = "") -> str:
    return f"CREATE TRIGGER {name} {when} BEGIN SELECT RAISE(ABORT, 'effectlog: {message}'); END"


DDL: tuple[str, ...] = (
    """CREATE TABLE fleet_requests (
        request_id INTEGER PRIMARY KEY,
        scope TEXT NOT NULL,
        idem_key TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        run_id TEXT NOT NULL UNIQUE,
        plan TEXT NOT NULL,
        requires TEXT NOT NULL,
        created_at REAL NOT NULL,
        current_attempt INTEGER,
        cancel_requested_at REAL,
        cancel_by TEXT,
        cancel_reason TEXT,
        finished_at REAL,
        UNIQUE (scope, idem_key)
    )""",
    """CREATE TABLE fleet_attempts (
        attempt_id INTEGER PRIMARY KEY,
        request_id INTEGER NOT NULL REFERENCES fleet_requests (request_id),
        attempt_no INTEGER NOT NULL,
        state TEXT NOT NULL,
        runner_id TEXT,
        fencing_token INTEGER,
        lease_expires_at REAL,
        base_seq INTEGER,
        created_at REAL NOT NULL,
        UNIQUE (request_id, attempt_no),
        UNIQUE (request_id, fencing_token)
    )""",
    f"CREATE UNIQUE INDEX fleet_one_open_attempt ON fleet_attempts (request_id) WHERE state NOT IN {_FINAL}",
    "CREATE INDEX fleet_attempts_state ON fleet_attempts (state, lease_expires_at)",
    """CREATE TABLE fleet_history (
        id INTEGER PRIMARY KEY,
        attempt_id INTEGER NOT NULL,
        request_id INTEGER NOT NULL,
        transition TEXT NOT NULL,
        event TEXT NOT NULL,
        actor TEXT NOT NULL,
        actor_name TEXT NOT NULL,
        from_state TEXT NOT NULL,
        to_state TEXT NOT NULL,
        reason TEXT NOT NULL,
        at REAL NOT NULL,
        detail TEXT NOT NULL
    )""",
    "CREATE INDEX fleet_history_request ON fleet_history (request_id, id)",
    """CREATE TABLE fleet_operations (
        attempt_id INTEGER NOT NULL,
        op_key TEXT NOT NULL,
        digest TEXT NOT NULL,
        result TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (attempt_id, op_key)
    ) WITHOUT ROWID""",
    *(
        _refuse(f"{table}_append_only_{op.lower()}", f"{table} is append-only", f"BEFORE {op} ON {table}")
        for table in ("fleet_history", "fleet_operations")
        for op in ("UPDATE", "DELETE")
    ),
    _refuse(
        "fleet_attempts_identity",
        "an attempt''s identity is immutable",
        "BEFORE UPDATE OF attempt_id, request_id, attempt_no, created_at ON fleet_attempts",
    ),
    _refuse(
        "fleet_attempts_lease_identity",
        "a lease''s runner, fencing token and base are immutable",
        "BEFORE UPDATE OF runner_id, fencing_token, base_seq ON fleet_attempts WHEN OLD.fencing_token IS NOT NULL",
    ),
    _refuse(
        "fleet_attempts_final",
        "a finished attempt never changes",
        f"BEFORE UPDATE ON fleet_attempts WHEN OLD.state IN {_FINAL}",
    ),
    _refuse("fleet_attempts_no_delete", "attempts are history", "BEFORE DELETE ON fleet_attempts"),
    _refuse(
        "fleet_requests_identity",
        "a request''s identity is immutable",
        "BEFORE UPDATE OF request_id, scope, idem_key, fingerprint, run_id, plan, requires, created_at"
        " ON fleet_requests",
    ),
    _refuse(
        "fleet_requests_cancel_once",
        "a cancellation is recorded once",
        "BEFORE UPDATE OF cancel_requested_at, cancel_by, cancel_reason ON fleet_requests"
        " WHEN OLD.cancel_requested_at IS NOT NULL",
    ),
    _refuse(
        "fleet_requests_end_once",
        "a request ends once",
        "BEFORE UPDATE OF finished_at ON fleet_requests WHEN OLD.finished_at IS NOT NULL",
    ),
    _refuse("fleet_requests_no_delete", "requests are history", "BEFORE DELETE ON fleet_requests"),
)


# What each version adds to the one before; a new store is created at v1 and migrated, so
# a fresh store and an upgraded one are the same tables.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: (  # poison requests: a per-request limit on automatic requeues, with backoff between them
        f"ALTER TABLE fleet_requests ADD COLUMN max_requeues INTEGER NOT NULL DEFAULT {limits.DEFAULT_MAX_REQUEUES}",
        "ALTER TABLE fleet_requests ADD COLUMN requeue_backoff_s REAL NOT NULL"
        f" DEFAULT {limits.DEFAULT_REQUEUE_BACKOFF_S}",
        "ALTER TABLE fleet_attempts ADD COLUMN not_before REAL",
    ),
}


# The claim's pick walks queued attempts in request order and stops at the first that fits, instead of
# evaluating every queued row and sorting them inside the file's one write transaction. Not a schema
# version: a store with it opens in versions without it, so it is made (if missing) at every open.
QUEUE_INDEX = "CREATE INDEX IF NOT EXISTS fleet_attempts_queue ON fleet_attempts (state, request_id)"


class SqliteFleetStore(SqlFleetStore):
    """A fleet store in one SQLite file (created 0600 if missing)."""

    owner_moves_together = True  # a run's prepare and start: three statements, not six (SqlFleetStore._owner_moves)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        chain: Chain | None = None,
        durability: Durability = "full",
        create: bool = True,
    ) -> None:
        self.location = os.fspath(path)
        self.dialect = SQLITE
        self._create = create  # False: a file without the fleet's tables is refused, not given them
        if not create and not _nonempty_file(self.location):  # before the journal below would make the file
            raise BadInput(f"--store {self.location}: no fleet store there")
        self._watcher: wakeups.Watcher | None = None
        self._journal = FleetSqliteJournal(self.location, chain=chain, durability=durability)  # journal tables first
        self._handle = self._journal.handle()  # one connection: see Handle
        try:
            with transaction(self._handle) as tx:
                self._migrate(tx)
        except BaseException:
            self.close()
            raise

    def _migrate(self, tx: SqliteTx) -> None:
        row = tx.one("SELECT value FROM meta WHERE key = 'fleet_schema_version'")
        if row is None and not self._create:
            raise JournalUnreadable(f"{self.location}: not a fleet store (no fleet tables); nothing was changed")
        if row is None:
            for sql in DDL:
                tx.run(sql)
            tx.run("INSERT INTO meta (key, value) VALUES ('fleet_schema_version', '1')")
            version = 1
        elif str(row[0]).isascii() and str(row[0]).isdigit() and int(row[0]) >= 1:  # not ², -1, x
            version = int(row[0])
        else:
            raise JournalUnreadable(f"{self.location}: not an effectlog fleet store (fleet schema version {row[0]!r})")
        if version > FLEET_SCHEMA_VERSION:
            raise JournalUnreadable(
                f"{self.location}: fleet schema v{version} is newer than this effectlog (v{FLEET_SCHEMA_VERSION})"
            )
        for step in range(version + 1, FLEET_SCHEMA_VERSION + 1):
            for sql in MIGRATIONS[step]:
                tx.run(sql)
            tx.run("UPDATE meta SET value = ? WHERE key = 'fleet_schema_version'", (str(step),))
        tx.run(QUEUE_INDEX)

    def _queued(self, tx: Tx) -> None:
        tx.run(wakeups.SQLITE_BUMP)

    def watch(self, wake: Callable[[], None], wanted: Callable[[], bool] | None = None) -> None:
        if self._watcher is None:
            self._watcher = wakeups.watch_sqlite(os.path.realpath(self.location), wake, wanted)

    def claim_within(
        self, tx: Tx, runner_id: str, capabilities: Sequence[str], lease_s: float, limit: int = 1
    ) -> list[Lease]:
        """``claim_next`` inside an open write transaction of this file (a journal append's: ``LeasedJournal``).

        The file's write lock is held from ``BEGIN IMMEDIATE`` to the commit, so the pick and
        the lease are as exclusive as in a claim of their own; they commit, or roll back, with
        the transaction they ride in.
        """
        return self._lease_next(tx, runner_id, _offer(runner_id, capabilities, lease_s, limit), lease_s, limit)

    def _tx(self, *, write: bool = True) -> AbstractContextManager[Tx]:
        return transaction(self._handle, write=write)

    def journal(self) -> FleetSqliteJournal:
        return self._journal

    def leased_journal(
        self, lease: Lease, before_append: Callable[[Sequence[Event]], None] | None = None
    ) -> LeasedJournal:
        return LeasedJournal(self._journal, lease, before_append, self.carry)

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        self._journal.close()

    def __enter__(self) -> SqliteFleetStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _nonempty_file(path: str) -> bool:
    """A file with bytes in it: what a store that is there is (an empty file would become a store)."""
    try:
        return os.path.isfile(path) and os.path.getsize(path) > 0
    except OSError:
        return False
