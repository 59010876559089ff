"""A SQLite fleet store's file: its connections, its transactions, and its journal.

The runs' journal in a store file is the one ``SqliteJournal`` (many writer processes
per file, one owner per run), with appends fenced by a runner's lease
(``FleetSqliteJournal.append_fenced``). ``Handle`` and ``transaction`` are the store's
own connection for its fleet tables. ``effectlog verify|status|reconcile --journal
STORE`` open the store file as any journal.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Literal

from effectlog.chain import Chain
from effectlog.errors import (
    EffectlogError,
    IntegrityError,
    JournalLocked,
    JournalUnreadable,
    StorageError,
)
from effectlog.events import Event
from effectlog.fleet import attempts as am
from effectlog.fleet import limits
from effectlog.fleet.fencing import Carry, Checked, Dialect, LeaseFence, batch_identity, check_batch_runs
from effectlog.fleet.model import Lease
from effectlog.fold import Record
from effectlog.journal import filelocks
from effectlog.journal.sqlite import SqliteJournal

Durability = Literal["full", "normal"]

SQLITE = Dialect(
    {
        "requests": "fleet_requests",
        "attempts": "fleet_attempts",
        "history": "fleet_history",
        "operations": "fleet_operations",
        "events": "events",
    },
    placeholder="?",
    # BEGIN IMMEDIATE holds the database's write lock for the whole transaction: no row locks needed.
    locks={
        "share": "",
        "update": "",
        # The store's clock in a query (SQLite: NULL, the caller's tx.now() is free).
        "clock": "NULL",
        "claim": "",
        # A request fits when it requires nothing the runner does not offer (the offer: a JSON array).
        "fits": "NOT EXISTS (SELECT 1 FROM json_each(r.requires) n WHERE n.value NOT IN"
        " (SELECT o.value FROM json_each(?) o))",
        # The journal's rows (schema v2, ``sqlite_schema``): a run's rows are the rowids of its number.
        "run_head_r": "COALESCE((SELECT e.id & 4294967295 FROM runs n, events e WHERE n.run_id = r.run_id"
        " AND e.id > n.run << 32 AND e.id < (n.run + 1) << 32 ORDER BY e.id DESC LIMIT 1), 0)",
        "run_head": "SELECT COALESCE((SELECT e.id & 4294967295 FROM runs n, events e WHERE n.run_id = ?"
        " AND e.id > n.run << 32 AND e.id < (n.run + 1) << 32 ORDER BY e.id DESC LIMIT 1), 0)",
        "bodies_after": "SELECT e.body FROM runs n, events e WHERE n.run_id = ? AND e.id > (n.run << 32 | ?)"
        " AND e.id < (n.run + 1) << 32 ORDER BY e.id",
    },
)


def translate(exc: sqlite3.Error, where: str) -> EffectlogError:
    text = " ".join(str(exc).split())
    if "locked" in text or "busy" in text:
        return JournalLocked(f"{where}: the store stayed locked by another process ({text})")
    if isinstance(exc, sqlite3.DatabaseError) and "not a database" in text:
        return JournalUnreadable(f"{where}: not an effectlog store (file is not a SQLite database)")
    if isinstance(exc, sqlite3.IntegrityError):
        return IntegrityError(f"{where}: the database refused the change ({text})")
    return StorageError(f"{where}: {text}")


class SqliteTx:
    """``effectlog.fleet.sqlstore.Tx`` over a connection inside ``BEGIN IMMEDIATE``; the host's clock."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        rows = self.db.execute(sql, params).fetchall()  # fetch all: a RETURNING statement must finish
        return tuple(rows[0]) if rows else None

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.db.execute(sql, params).fetchall()]

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return int(self.db.execute(sql, params).rowcount)

    def now(self) -> float:
        return time.time()


class Handle:
    """One connection to a store file, and how its users take turns.

    Threads of one process share the connection under a thread lock. Writers, in this
    process and others, take turns at the file's writers' gate (``filelocks``, the same
    gate the journal's appends use) before ``BEGIN IMMEDIATE``: SQLite's own busy handler
    sleeps up to 100 ms between tries, so under contention a free database would sit idle
    while its waiters sleep. The database's lock is still what protects the data.

    ``db``: the store's journal's connection, shared instead of a second one. SQLite
    empties a connection's page cache whenever another connection has committed, so with
    two connections each claim re-read the pages the run's appends had written and each
    run's first append those the claim had (about 48 reads per two-step run, none now).
    The journal's writers take this process's turn at the gate (``SharedFile.turn``) for
    their transactions, so this handle's read transactions take it too: one transaction
    per connection at a time. The journal closes the connection, not the handle.
    """

    def __init__(self, where: str, db: sqlite3.Connection, file: filelocks.SharedFile, busy_timeout_s: float) -> None:
        self.where = where
        self.busy_timeout_s = busy_timeout_s
        self.db = db  # the journal's: it opened the file (sidecar check, registration, WAL) and closes it
        self.file = file
        self.lock = threading.Lock()

    def writing(self) -> AbstractContextManager[None]:
        return self.file.gate(self.where, self.busy_timeout_s)

    @contextmanager
    def reading(self) -> Iterator[None]:
        """A read transaction's turn: this process's writers' turn on the shared connection (not the file's gate)."""
        turn = self.file.turn
        if not turn.acquire(timeout=self.busy_timeout_s):
            raise JournalLocked(
                f"{self.where}: another writer of this process kept the store for {self.busy_timeout_s:g}s"
            )
        try:
            yield
        finally:
            turn.release()


@contextmanager
def transaction(handle: Handle, *, write: bool = True) -> Iterator[SqliteTx]:
    """One transaction (``BEGIN IMMEDIATE`` for writes, after the writers' OS lock)."""
    with handle.lock, handle.writing() if write else handle.reading():
        db = handle.db
        try:
            db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.Error as exc:
            raise translate(exc, handle.where) from None
        try:
            yield SqliteTx(db)
            db.execute("COMMIT")
        except BaseException as exc:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise translate(exc, handle.where) from None
            raise


_LEASE_HEADS = 64  # FleetSqliteJournal._lease_heads: runs whose head a lease's last batch left, at most


# The lease check of ``fencing.check_op`` (current runner and token, a live state, an expiry ahead and
# no further than MAX_LEASE_S) as the WHERE of the operation record's own INSERT: a batch that
# carries no transition is admitted and recorded by one statement. OR IGNORE: a batch this attempt
# recorded already inserts nothing, and the full check then tells a retry from a conflict.
_RECORD_IF_CURRENT = (
    "INSERT OR IGNORE INTO fleet_operations (attempt_id, op_key, digest, result, at)"
    " SELECT a.attempt_id, ?, ?, '', ? FROM fleet_attempts a WHERE a.attempt_id = ? AND a.runner_id = ?"
    f" AND a.fencing_token = ? AND a.state IN {am.sql_list(am.LIVE)} AND a.lease_expires_at > ?"
    " AND a.lease_expires_at <= ?"
)


# The same, when the lease's last batch left the run's head at a seq this process remembers: also only while
# no event follows that seq (one probe of the events' key), so the head is the one remembered.
_RECORD_IF_CURRENT_AT = (
    _RECORD_IF_CURRENT + " AND NOT EXISTS (SELECT 1 FROM runs n, events e WHERE n.run_id = ?"
    " AND e.id > (n.run << 32 | ?) AND e.id < (n.run + 1) << 32)"
)


class SqliteLeaseFence(LeaseFence):
    """``LeaseFence`` with the common case in one statement: check the lease and record the batch.

    A batch that carries no transition (4 of a two-step run's 6) needs no attempt state,
    so ``_RECORD_IF_CURRENT`` replaces the check's SELECT and the record's INSERT. When it
    inserts nothing (not current, or the batch was recorded before) the full check runs
    and decides as before (``StaleLease``, a replay, ``IdempotencyConflict``). The write
    lock of ``BEGIN IMMEDIATE`` holds the whole file until the commit, so the check
    still holds when the events go in.
    """

    fresh = False  # admitted as a batch not written before (its rows went in): FleetSqliteJournal._lease_heads
    # The head this lease's last batch left (FleetSqliteJournal), and once the check found it is still the
    # run's head, in the batch's transaction: what the journal chains the batch onto without reading it.
    remembered: tuple[int, bytes] | None = None
    trusted: tuple[int, bytes] | None = None

    def admit_inserting(
        self, conn: Any, events: Sequence[Event], encoded: Sequence[bytes], insert: tuple[str, Sequence[Any]] | None
    ) -> bool:
        self.fresh = self._admit(conn, events, encoded, insert)
        return self.fresh

    def _admit(
        self, conn: Any, events: Sequence[Event], encoded: Sequence[bytes], insert: tuple[str, Sequence[Any]] | None
    ) -> bool:
        if insert is None and not (self.carry is not None and self.carry.wants(events)):
            check_batch_runs(events, self.lease)
            tx = self.tx_of(conn)
            op_key, body = self._op = batch_identity(events, encoded)
            lease, now, head = self.lease, tx.now(), self.remembered
            params = (op_key, body, now, lease.attempt_id, lease.runner_id, lease.token, now, now + limits.MAX_LEASE_S)
            if head is None:
                inserted = tx.run(_RECORD_IF_CURRENT, params)
            else:
                inserted = tx.run(_RECORD_IF_CURRENT_AT, (*params, lease.run_id, head[0]))
            if inserted == 1:
                self._checked = Checked("", False, now, None, recorded=True)
                self.trusted = head
                return True
        return super().admit_inserting(conn, events, encoded, insert)


class FleetSqliteJournal(SqliteJournal):
    """The one SQLite journal over a fleet store's file, plus appends fenced by a lease.

    Everything a journal does (chain, deduplication, seals, ownership, the writers' gate)
    is ``SqliteJournal``'s; a fenced append is its append with a ``LeaseFence`` checked
    in the same transaction. Threads of a runner share it: its writers take turns at the
    file's gate.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, chain: Chain | None = None, durability: Durability = "full"
    ) -> None:
        super().__init__(path, chain=chain, durability=durability)
        # The head a lease's last committed batch left, by run: (attempt id, token, head). Its next batch
        # that carries no transition chains onto it instead of reading the head (one statement per append
        # fewer), and only once the lease check in its own transaction also found no event after that head
        # (``SqliteLeaseFence.trusted``, read by ``head`` on this thread): a lease is not the only writer of
        # its run (a person's approval is written while the attempt waits for it). Otherwise the head is
        # read as before. Bounded: a runner holds a few leases at a time.
        self._lease_heads: dict[str, tuple[int, int, tuple[int, bytes]]] = {}
        self._lease_heads_lock = threading.Lock()  # threads of a runner append different runs at once
        self._fenced = threading.local()

    @property
    def connection(self) -> sqlite3.Connection:
        """The journal's connection (tests look at its rows through it)."""
        return self._db

    def handle(self) -> Handle:
        """The journal's connection and file, for the store's own transactions (see ``Handle``)."""
        assert self._file is not None
        return Handle(self.location, self._db, self._file, self.busy_timeout_s)

    def append_fenced(self, events: Sequence[Event], lease: Lease | None, carry: Carry | None = None) -> list[Record]:
        if lease is None:
            return self.append(events)  # not under a lease: an operator's or a plain writer's batch
        if not events:
            return []
        run_id, heads, guard = events[0].run_id, self._lease_heads, self._lease_heads_lock
        with guard:
            known = heads.pop(run_id, None)  # taken out: a batch that fails leaves no head behind
        fence = SqliteLeaseFence(lease, SQLITE, SqliteTx, carry)
        if known is not None and known[:2] == (lease.attempt_id, lease.token) and lease.run_id == run_id:
            fence.remembered = known[2]
        local = self._fenced
        local.fence = fence
        try:
            records = self.append_under(events, fence)
        finally:
            local.fence = None
        if fence.fresh and all(r.run_id == run_id for r in records):  # written now, not a batch written before
            last = records[-1]
            with guard:
                while len(heads) >= _LEASE_HEADS:
                    heads.pop(next(iter(heads)))  # the oldest
                heads[run_id] = (lease.attempt_id, lease.token, (last.seq, last.hash))
        return records

    def head(self, run_id: str) -> tuple[int, bytes]:
        fence: SqliteLeaseFence | None = getattr(self._fenced, "fence", None)  # this thread's fenced append
        if fence is not None and fence.trusted is not None and fence.lease.run_id == run_id:
            return fence.trusted
        return super().head(run_id)

    def append(self, events: Sequence[Event]) -> list[Record]:
        with self._lease_heads_lock:
            for event in events:  # a plain writer's batch moves a run's head past what a lease last left
                self._lease_heads.pop(event.run_id, None)
        return super().append(events)

    def __enter__(self) -> FleetSqliteJournal:
        return self
