"""The journal inside a SQLite fleet store: the same file, many writer processes, fenced appends.

The single-process ``SqliteJournal`` keeps one writer per file with an OS lock. A
fleet on one host has many runner processes writing runs in one file, so this
journal takes no file lock: every append is one ``BEGIN IMMEDIATE`` transaction
(SQLite's own write lock serialises the processes) that reads each run's head
afresh, checks the lease against the fleet tables in the same file, and inserts.
The tables, triggers and bytes are those of ``effectlog.journal.sqlite`` (same
migrations), so ``effectlog verify|status|reconcile --journal STORE`` work on the
store file as on any journal.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

from effectlog.chain import GENESIS, Chain
from effectlog.errors import (
    EffectlogError,
    EventConflict,
    IntegrityError,
    JournalLocked,
    JournalUnreadable,
    SequenceGap,
    StorageError,
)
from effectlog.events import Event, encode
from effectlog.fleet.fencing import Dialect, batch_identity, check_batch_runs, check_lease, record_operation, replayed
from effectlog.fleet.model import Lease
from effectlog.fold import Record
from effectlog.journal.protocol import SCHEMA_VERSION
from effectlog.journal.sqlite import MIGRATIONS

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
    locks={"share": "", "update": "", "claim": ""},
)

_INSERT = "INSERT INTO events (run_id, seq, step_id, phase, attempt, body, hash) VALUES (?, ?, ?, ?, ?, ?, ?)"
_HEAD = "SELECT seq, hash FROM events WHERE run_id = ? ORDER BY seq DESC LIMIT 1"


def translate(exc: sqlite3.Error, where: str) -> EffectlogError:
    text = " ".join(str(exc).split())
    if "locked" in text or "busy" in text:
        return JournalLocked(f"{where}: the store stayed locked by another process ({text})")
    if isinstance(exc, sqlite3.DatabaseError) and "not a database" in text:
        return JournalUnreadable(f"{where}: not an effectlog store (file is not a SQLite database)")
    if isinstance(exc, sqlite3.IntegrityError):
        return IntegrityError(f"{where}: the database refused the change ({text})")
    return StorageError(f"{where}: {text}")


def connect(path: str, durability: Durability = "full", busy_timeout_s: float = 60.0) -> sqlite3.Connection:
    """A connection for one process: WAL, ``synchronous=FULL`` unless asked otherwise, long busy timeout."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # new stores are private to their owner
        os.close(fd)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StorageError(f"{path}: cannot create the store ({exc.strerror})") from None
    try:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_s)
        db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode != "wal":
            raise StorageError(f"{path}: could not switch the store to WAL (got {mode})")
        db.execute(f"PRAGMA synchronous = {'FULL' if durability == 'full' else 'NORMAL'}")
    except sqlite3.Error as exc:
        raise translate(exc, path) from None
    return db


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

    Threads of one process share the connection under a thread lock. Writer processes
    queue on an OS lock of ``<store>.writers`` before ``BEGIN IMMEDIATE``: SQLite's own
    busy handler sleeps up to 100 ms between tries, so under contention a free database
    would sit idle while its waiters sleep; polling the OS lock hands it over within
    about a millisecond. The database's lock is still what protects the data.
    """

    def __init__(self, path: str, durability: Durability = "full", busy_timeout_s: float = 60.0) -> None:
        self.where = path
        self.busy_timeout_s = busy_timeout_s
        self.db = connect(path, durability, busy_timeout_s)
        self.lock = threading.Lock()
        try:
            self.gate = os.open(path + ".writers", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            self.db.close()
            raise StorageError(f"{path}.writers: cannot open the writers' lock ({exc.strerror})") from None

    @contextmanager
    def writing(self) -> Iterator[None]:
        deadline = time.monotonic() + self.busy_timeout_s
        pause = 0.0002
        while True:
            try:
                fcntl.flock(self.gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise JournalLocked(f"{self.where}: another process kept the store's write lock") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.002)
        try:
            yield
        finally:
            fcntl.flock(self.gate, fcntl.LOCK_UN)

    def close(self) -> None:
        with self.lock:
            with contextlib.suppress(sqlite3.Error):
                self.db.close()
            with contextlib.suppress(OSError):
                os.close(self.gate)


@contextmanager
def transaction(handle: Handle, *, write: bool = True) -> Iterator[SqliteTx]:
    """One transaction (``BEGIN IMMEDIATE`` for writes, after the writers' OS lock)."""
    with handle.lock, handle.writing() if write else contextlib.nullcontext():
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


class FleetSqliteJournal:
    """The journal Protocol (plus ``append_fenced``) over the events table of a SQLite fleet store."""

    def __init__(
        self, path: str | os.PathLike[str], *, chain: Chain | None = None, durability: Durability = "full"
    ) -> None:
        self.location = os.fspath(path)
        self.chain = chain or Chain()
        self._handle = Handle(self.location, durability)
        try:
            with transaction(self._handle) as tx:
                self._migrate(tx)
        except BaseException:
            self._handle.close()
            raise

    def _migrate(self, tx: SqliteTx) -> None:
        tables = {r[0] for r in tx.all("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "events" not in tables:
            if tables - {"meta"}:
                raise JournalUnreadable(f"{self.location}: not an effectlog store (unexpected tables)")
            for statements in MIGRATIONS:
                for sql in statements:
                    tx.run(sql)
            tx.run("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            tx.run("INSERT INTO meta (key, value) VALUES ('chain', ?)", (self.chain.name,))
            return
        row = tx.one("SELECT value FROM meta WHERE key = 'schema_version'")
        if row is None or not str(row[0]).isdigit():
            raise JournalUnreadable(f"{self.location}: not an effectlog store (no schema version)")
        if int(row[0]) != SCHEMA_VERSION:
            raise JournalUnreadable(
                f"{self.location}: journal schema v{row[0]}, this effectlog writes v{SCHEMA_VERSION}; "
                "open it once with a matching effectlog"
            )
        chain = tx.one("SELECT value FROM meta WHERE key = 'chain'")
        recorded = chain[0] if chain else "sha256"
        if recorded != self.chain.name:
            hint = "set EFFECTLOG_JOURNAL_KEY or --key-file" if recorded != "sha256" else "this journal has no key"
            raise JournalUnreadable(
                f"{self.location}: journal chain is {recorded}, opened as {self.chain.name} ({hint})"
            )

    # -- the Protocol -------------------------------------------------------------------

    def append(self, events: Sequence[Event]) -> list[Record]:
        return self.append_fenced(events, None)

    def append_fenced(self, events: Sequence[Event], lease: Lease | None) -> list[Record]:
        if not events:
            return []
        if lease is not None:
            check_batch_runs(events, lease)
        encoded = [encode(e) for e in events]
        with transaction(self._handle) as tx:
            if lease is None:
                return self._insert(tx, events, encoded)
            op_key, body = batch_identity(events, encoded)
            if replayed(tx, SQLITE, lease, op_key, body) is not None:
                return [self._existing(tx, e.run_id, e.seq, b) for e, b in zip(events, encoded, strict=True)]
            now = tx.now()
            check_lease(tx, SQLITE, lease, now, lock="share")
            records = self._insert(tx, events, encoded)
            record_operation(tx, SQLITE, lease, op_key, body_digest=body, result="", now=now)
            return records

    def _insert(self, tx: SqliteTx, events: Sequence[Event], encoded: Sequence[bytes]) -> list[Record]:
        heads: dict[str, tuple[int, bytes]] = {}
        out: list[Record] = []
        for event, body in zip(events, encoded, strict=True):
            run_id, seq = event.run_id, event.seq
            last_seq, last_hash = heads.get(run_id) or self._head(tx, run_id)
            if seq <= last_seq:
                out.append(self._existing(tx, run_id, seq, body))
                continue
            if seq != last_seq + 1:
                raise SequenceGap(f"append expected seq {last_seq + 1}, got {seq}", run_id=run_id, seq=seq)
            digest = self.chain.link(last_hash, body)
            try:
                tx.run(_INSERT, (run_id, seq, event.step_key, event.phase, event.attempt_no, body, digest))
            except sqlite3.IntegrityError:
                raise self._dedup_conflict(tx, event) from None
            heads[run_id] = (seq, digest)
            out.append(Record(run_id, seq, body, digest))
        return out

    @staticmethod
    def _head(tx: SqliteTx, run_id: str) -> tuple[int, bytes]:
        row = tx.one(_HEAD, (run_id,))
        return (int(row[0]), bytes(row[1])) if row else (0, GENESIS)

    @staticmethod
    def _existing(tx: SqliteTx, run_id: str, seq: int, body: bytes) -> Record:
        row = tx.one("SELECT body, hash FROM events WHERE run_id = ? AND seq = ?", (run_id, seq))
        if row is None or bytes(row[0]) != body:
            raise EventConflict("a different event is already recorded at this seq", run_id=run_id, seq=seq)
        return Record(run_id, seq, bytes(row[0]), bytes(row[1]))

    @staticmethod
    def _dedup_conflict(tx: SqliteTx, event: Event) -> EventConflict:
        row = tx.one(
            "SELECT seq FROM events WHERE run_id = ? AND step_id = ? AND phase = ? AND attempt = ?",
            (event.run_id, event.step_key, event.phase, event.attempt_no),
        )
        at = f" at seq {row[0]}" if row else ""
        return EventConflict(
            f"{event.phase} for attempt {event.attempt_no} is already recorded{at}",
            run_id=event.run_id,
            seq=event.seq,
            step_id=event.step_key or None,
        )

    def _query(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._handle.lock:
            try:
                return [tuple(r) for r in self._handle.db.execute(sql, params).fetchall()]
            except sqlite3.Error as exc:
                raise translate(exc, self.location) from None

    def read(self, run_id: str, after_seq: int = 0) -> Iterator[Record]:
        rows = self._query(
            "SELECT seq, body, hash, step_id, phase, attempt FROM events WHERE run_id = ? AND seq > ? ORDER BY seq",
            (run_id, after_seq),
        )
        for seq, body, digest, step_id, phase, attempt in rows:
            yield Record(run_id, int(seq), bytes(body), bytes(digest), step_id, phase, attempt)

    def head(self, run_id: str) -> tuple[int, bytes]:
        rows = self._query(_HEAD, (run_id,))
        return (int(rows[0][0]), bytes(rows[0][1])) if rows else (0, GENESIS)

    def runs(self) -> list[str]:
        return [str(r[0]) for r in self._query("SELECT DISTINCT run_id FROM events ORDER BY run_id", ())]

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> FleetSqliteJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
