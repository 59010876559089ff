"""The SQLite journal: WAL, ``synchronous=FULL``, one writer per file by OS lock.

Append-only is enforced by the database (triggers abort UPDATE and DELETE), and
deduplication is a constraint (primary key ``(run_id, seq)``, unique
``(run_id, step_id, phase, attempt)``), never a check before the insert.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Literal

from effectlog.chain import GENESIS, Chain
from effectlog.errors import (
    EventConflict,
    JournalLocked,
    JournalUnreadable,
    SequenceGap,
    StorageError,
)
from effectlog.events import Event, encode
from effectlog.fold import Record
from effectlog.journal.protocol import SCHEMA_VERSION

Durability = Literal["full", "normal"]

# Ordered migrations: index i brings schema version i to i + 1.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE events (
            run_id TEXT NOT NULL,
            seq INTEGER NOT NULL CHECK (seq > 0),
            step_id TEXT NOT NULL,
            phase TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            body BLOB NOT NULL,
            hash BLOB NOT NULL,
            PRIMARY KEY (run_id, seq),
            UNIQUE (run_id, step_id, phase, attempt)
        ) WITHOUT ROWID""",
        """CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
           BEGIN SELECT RAISE(ABORT, 'effectlog: events are append-only'); END""",
        """CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
           BEGIN SELECT RAISE(ABORT, 'effectlog: events are append-only'); END""",
    ),
)
assert len(MIGRATIONS) == SCHEMA_VERSION

_INSERT = (
    "INSERT INTO events (run_id, seq, step_id, phase, attempt, body, hash) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def _translate(exc: sqlite3.Error, path: str) -> Exception:
    text = str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and "not a database" in text:
        return JournalUnreadable(f"{path}: not an effectlog journal (file is not a SQLite database)")
    if "readonly" in text or "read-only" in text:
        return StorageError(f"{path}: journal is read-only ({text})")
    if "full" in text:
        return StorageError(f"{path}: disk full while writing the journal ({text})")
    return StorageError(f"{path}: {text}")


class WriterLock:
    """An exclusive OS lock on ``<journal>.lock``, holding the writer's pid."""

    def __init__(self, journal_path: str) -> None:
        self.path = journal_path + ".lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StorageError(f"{self.path}: cannot open the writer lock ({exc.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            pid = f" (pid {holder})" if holder.isdigit() else ""
            raise JournalLocked(
                f"journal {self.path[:-5]} is being written by another process{pid}",
                holder_pid=int(holder) if holder.isdigit() else None,
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class SqliteJournal:
    """A journal in one SQLite file. ``writer=True`` takes the file's writer lock."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        writer: bool = True,
        chain: Chain | None = None,
        durability: Durability = "full",
    ) -> None:
        self.location = str(path)
        self.chain = chain or Chain()
        self.writer = writer
        self._heads: dict[str, tuple[int, bytes]] = {}
        # Test hook: called inside the transaction, after the rows are written, before COMMIT.
        self.before_commit: Callable[[Sequence[Event]], None] | None = None
        self._lock: WriterLock | None = None
        if not writer and not Path(self.location).is_file():
            raise JournalUnreadable(f"{self.location}: no journal file there")
        if writer:
            self._create_private(self.location)
            self._lock = WriterLock(self.location)
            self._lock.acquire()
        try:
            self._db = self._connect(durability)
            self._migrate()
        except BaseException:
            if self._lock:
                self._lock.release()
            raise

    @staticmethod
    def _create_private(path: str) -> None:
        """A new journal file is created readable by its owner only (0600)."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return
        except OSError as exc:
            raise StorageError(f"{path}: cannot create the journal ({exc.strerror})") from None
        os.close(fd)

    def _connect(self, durability: Durability) -> sqlite3.Connection:
        try:
            if self.writer:
                db = sqlite3.connect(self.location, isolation_level=None, check_same_thread=False)
                db.execute("PRAGMA busy_timeout = 5000")
                mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if mode != "wal":
                    raise StorageError(f"{self.location}: could not switch the journal to WAL (got {mode})")
                # FULL: a committed append survives power loss. NORMAL is an explicit, unsafe opt-in.
                db.execute(f"PRAGMA synchronous = {'FULL' if durability == 'full' else 'NORMAL'}")
            else:
                uri = Path(self.location).resolve().as_uri() + "?mode=ro"
                db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
                db.execute("PRAGMA busy_timeout = 5000")
        except sqlite3.Error as exc:
            raise _translate(exc, self.location) from None
        return db

    def _version(self) -> int:
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return 0
        if "meta" not in tables or "events" not in tables:
            raise JournalUnreadable(f"{self.location}: not an effectlog journal (unexpected tables)")
        row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None or not str(row[0]).isdigit():
            raise JournalUnreadable(f"{self.location}: not an effectlog journal (no schema version)")
        return int(row[0])

    def _migrate(self) -> None:
        try:
            version = self._version()
            if version > SCHEMA_VERSION:
                raise JournalUnreadable(
                    f"{self.location}: journal schema v{version} is newer than this effectlog "
                    f"(v{SCHEMA_VERSION}); upgrade effectlog to read it"
                )
            if version == SCHEMA_VERSION:
                self._check_chain()
                return
            if not self.writer:
                raise JournalUnreadable(f"{self.location}: journal schema v{version} needs a writer to migrate")
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for statements in MIGRATIONS[version:]:
                    for sql in statements:
                        self._db.execute(sql)
                self._db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
                if version == 0:
                    self._db.execute("INSERT INTO meta (key, value) VALUES ('chain', ?)", (self.chain.name,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise _translate(exc, self.location) from None

    def _check_chain(self) -> None:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'chain'").fetchone()
        recorded = row[0] if row else "sha256"
        if recorded != self.chain.name:
            hint = "set EFFECTLOG_JOURNAL_KEY or --key-file" if recorded != "sha256" else "this journal has no key"
            raise JournalUnreadable(
                f"{self.location}: journal chain is {recorded}, opened as {self.chain.name} ({hint})"
            )

    # -- the Protocol -------------------------------------------------------------

    def head(self, run_id: str) -> tuple[int, bytes]:
        cached = self._heads.get(run_id)
        if cached is not None:
            return cached
        try:
            row = self._db.execute(
                "SELECT seq, hash FROM events WHERE run_id = ? ORDER BY seq DESC LIMIT 1", (run_id,)
            ).fetchone()
        except sqlite3.Error as exc:
            raise _translate(exc, self.location) from None
        head = (row[0], bytes(row[1])) if row else (0, GENESIS)
        if self.writer:  # only the lock holder may trust a cached head
            self._heads[run_id] = head
        return head

    def append(self, events: Sequence[Event]) -> list[Record]:
        if not self.writer:
            raise StorageError(f"{self.location}: journal opened read-only")
        if not events:
            return []
        db = self._db
        heads: dict[str, tuple[int, bytes]] = {}
        out: list[Record] = []
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                for event in events:
                    run_id = event.run_id
                    last_seq, last_hash = heads.get(run_id) or self.head(run_id)
                    body = encode(event)
                    if event.seq <= last_seq:
                        out.append(self._existing(run_id, event.seq, body))
                        continue
                    if event.seq != last_seq + 1:
                        raise SequenceGap(
                            f"append expected seq {last_seq + 1}, got {event.seq}", run_id=run_id, seq=event.seq
                        )
                    digest = self.chain.link(last_hash, body)
                    try:
                        db.execute(
                            _INSERT,
                            (run_id, event.seq, event.step_key, event.phase, event.attempt_no, body, digest),
                        )
                    except sqlite3.IntegrityError:
                        raise self._dedup_conflict(event) from None
                    heads[run_id] = (event.seq, digest)
                    out.append(Record(run_id, event.seq, body, digest))
                if self.before_commit is not None:
                    self.before_commit(events)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise _translate(exc, self.location) from None
        self._heads.update(heads)
        return out

    def _existing(self, run_id: str, seq: int, body: bytes) -> Record:
        row = self._db.execute("SELECT body, hash FROM events WHERE run_id = ? AND seq = ?", (run_id, seq)).fetchone()
        if row is None or bytes(row[0]) != body:
            raise EventConflict("a different event is already recorded at this seq", run_id=run_id, seq=seq)
        return Record(run_id, seq, bytes(row[0]), bytes(row[1]))

    def _dedup_conflict(self, event: Event) -> EventConflict:
        row = self._db.execute(
            "SELECT seq FROM events WHERE run_id = ? AND step_id = ? AND phase = ? AND attempt = ?",
            (event.run_id, event.step_key, event.phase, event.attempt_no),
        ).fetchone()
        at = f" at seq {row[0]}" if row else ""
        return EventConflict(
            f"{event.phase} for attempt {event.attempt_no} is already recorded{at}",
            run_id=event.run_id,
            seq=event.seq,
            step_id=event.step_key or None,
        )

    def read(self, run_id: str, after_seq: int = 0) -> Iterator[Record]:
        try:
            rows = self._db.execute(
                "SELECT seq, body, hash FROM events WHERE run_id = ? AND seq > ? ORDER BY seq", (run_id, after_seq)
            ).fetchall()
        except sqlite3.Error as exc:
            raise _translate(exc, self.location) from None
        for seq, body, digest in rows:
            yield Record(run_id, seq, bytes(body), bytes(digest))

    def runs(self) -> list[str]:
        try:
            return [r[0] for r in self._db.execute("SELECT DISTINCT run_id FROM events ORDER BY run_id")]
        except sqlite3.Error as exc:
            raise _translate(exc, self.location) from None

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        if self._lock:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> SqliteJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
