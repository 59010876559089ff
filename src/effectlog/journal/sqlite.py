"""The SQLite journal: WAL, ``synchronous=FULL``, one writer per file by OS lock.

Append-only is enforced by the database (triggers abort UPDATE and DELETE), and
deduplication is a constraint (primary key ``(run_id, seq)``, unique
``(run_id, step_id, phase, attempt)``), never a check before the insert.

Closed runs may carry a seal (``effectlog.seal``) in the append-only ``seals``
table, written in the same transaction as the closing event and bound to it by the
chain. Seals are derived data, not part of the event schema: a writer adds the
table if it is missing (older journals), readers treat a missing table as "no
seals", so the schema version does not change.
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
    JournalDamaged,
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

SEALS_DDL: tuple[str, ...] = (
    """CREATE TABLE seals (
        run_id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL CHECK (seq > 0),
        body BLOB NOT NULL,
        hash BLOB NOT NULL
    )""",
    """CREATE TRIGGER seals_append_only_update BEFORE UPDATE ON seals
       BEGIN SELECT RAISE(ABORT, 'effectlog: seals are append-only'); END""",
    """CREATE TRIGGER seals_append_only_delete BEFORE DELETE ON seals
       BEGIN SELECT RAISE(ABORT, 'effectlog: seals are append-only'); END""",
)
READ_PAGE_ROWS = 2000
_READ_PAGE = (
    "SELECT seq, body, hash, step_id, phase, attempt FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?"
)
WAL_AUTOCHECKPOINT_PAGES = 8000  # about 32 MiB of WAL between checkpoints (SQLite's default: 1,000 pages)
_INSERT_SEAL = "INSERT INTO seals (run_id, seq, body, hash) VALUES (?, ?, ?, ?)"
# One statement, so one snapshot: the seal and the run's last event together.
_SELECT_SEAL = (
    "SELECT s.seq, s.body, s.hash, e.seq, e.hash FROM seals s JOIN events e ON e.run_id = s.run_id "
    "WHERE s.run_id = ? ORDER BY e.seq DESC LIMIT 1"
)


def _translate(exc: sqlite3.Error, path: str) -> Exception:
    text = str(exc)
    if isinstance(exc, sqlite3.DatabaseError) and "not a database" in text:
        return JournalUnreadable(f"{path}: not an effectlog journal (file is not a SQLite database)")
    if isinstance(exc, sqlite3.DatabaseError) and "malformed" in text:
        return JournalDamaged(f"{path}: the journal file is damaged ({text}); restore it from a copy")
    if "readonly" in text or "read-only" in text:
        return StorageError(f"{path}: journal is read-only ({text})")
    if "full" in text:
        return StorageError(f"{path}: disk full while writing the journal ({text})")
    if getattr(exc, "sqlite_errorname", "") == "SQLITE_IOERR_WRITE":  # e.g. a file size limit (EFBIG)
        return StorageError(f"{path}: the journal could not be written ({text}); the write was not committed")
    return StorageError(f"{path}: {text}")


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


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
            self._cursor = self._db.cursor()  # reused by append: one cursor instead of one per row
            self._migrate()
            if writer:
                self._ensure_seals()
        except BaseException:
            if self._lock:
                self._lock.release()
            raise

    @staticmethod
    def _create_private(path: str) -> None:
        """A new journal file is created readable by its owner only (0600)."""
        if _size(path + "-wal") and not _size(path):
            # SQLite would replay a stray WAL into a new or empty file: history that is not this journal's.
            raise JournalUnreadable(f"{path}-wal: a WAL without its database; restore {path} or move the WAL away")
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
                # Checkpoints run inside a commit and sync the database file too. A group commit
                # of many runs dirties a few pages per run, so the default (1,000 pages) made
                # every few commits pay for one. Durability does not depend on it: the WAL is.
                db.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
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
                if version == 0:
                    raise JournalUnreadable(f"{self.location}: no journal there yet (the database is empty)")
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

    def _ensure_seals(self) -> None:
        try:
            if self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'seals'").fetchone():
                return
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql in SEALS_DDL:
                    self._db.execute(sql)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise _translate(exc, self.location) from None

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
        return self.append_sealed(events, ())

    def append_sealed(self, events: Sequence[Event], seals: Sequence[tuple[str, int, bytes]]) -> list[Record]:
        """``append``, plus seals of runs this batch closes, in the same transaction (``effectlog.seal``)."""
        if not self.writer:
            raise StorageError(f"{self.location}: journal opened read-only")
        if not events and not seals:
            return []
        db = self._db
        heads: dict[str, tuple[int, bytes]] = {}
        out: list[Record] = []
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                link, insert = self.chain.link, self._cursor.execute  # bound once: this loop is the hot path
                for event in events:
                    run_id, seq = event.run_id, event.seq
                    last_seq, last_hash = heads.get(run_id) or self.head(run_id)
                    body = encode(event)
                    if seq <= last_seq:
                        out.append(self._existing(run_id, seq, body))
                        continue
                    if seq != last_seq + 1:
                        raise SequenceGap(f"append expected seq {last_seq + 1}, got {seq}", run_id=run_id, seq=seq)
                    digest = link(last_hash, body)
                    try:
                        insert(_INSERT, (run_id, seq, event.step_key, event.phase, event.attempt_no, body, digest))
                    except sqlite3.IntegrityError:
                        raise self._dedup_conflict(event) from None
                    heads[run_id] = (seq, digest)
                    out.append(Record(run_id, seq, body, digest))
                for run_id, seq, seal in seals:
                    self._insert_seal(run_id, seq, seal, heads.get(run_id) or self.head(run_id))
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

    def _insert_seal(self, run_id: str, seq: int, seal: bytes, head: tuple[int, bytes]) -> None:
        if seq != head[0]:
            raise SequenceGap(
                f"a seal must follow the run's last event (seq {head[0]}), not seq {seq}", run_id=run_id, seq=seq
            )
        try:
            self._cursor.execute(_INSERT_SEAL, (run_id, seq, seal, self.chain.link(head[1], seal)))
        except sqlite3.IntegrityError:
            row = self._db.execute("SELECT body FROM seals WHERE run_id = ?", (run_id,)).fetchone()
            if row is None or bytes(row[0]) != seal:
                raise EventConflict("the run is already sealed with another seal", run_id=run_id, seq=seq) from None

    def sealed(self, run_id: str) -> tuple[bytes, bytes] | None:
        """``(seal, chain head)`` when the run's seal is bound to its last event; ``None`` otherwise."""
        try:
            row = self._db.execute(_SELECT_SEAL, (run_id,)).fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):  # a journal no writer has opened since seals exist
                return None
            raise _translate(exc, self.location) from None
        except sqlite3.Error as exc:
            raise _translate(exc, self.location) from None
        if row is None:
            return None
        seq, seal, digest, head_seq, head = row[0], bytes(row[1]), bytes(row[2]), row[3], bytes(row[4])
        if seq != head_seq or self.chain.link(head, seal) != digest:
            return None
        return seal, head

    def stored_seals(self, run_id: str | None = None) -> list[tuple[str, int, bytes, bytes]]:
        """The seal rows as stored, ``(run id, seq, body, hash)``: of one run, or of all; unchecked."""
        where, params = ("WHERE run_id = ?", (run_id,)) if run_id is not None else ("", ())
        try:
            rows = self._db.execute(f"SELECT run_id, seq, body, hash FROM seals {where} ORDER BY run_id", params)
            return [(r[0], r[1], bytes(r[2]), bytes(r[3])) for r in rows]
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise _translate(exc, self.location) from None
        except sqlite3.Error as exc:
            raise _translate(exc, self.location) from None

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
        # Page by page, so a long history is never all in memory at once (and its rows die
        # young instead of filling the GC's old generation). Each page is a finished statement,
        # so nothing stays open on the writer's connection between pages; the log is
        # append-only and gap-free per run, so the pages are the history as of the last one.
        while True:
            try:
                rows = self._db.execute(_READ_PAGE, (run_id, after_seq, READ_PAGE_ROWS)).fetchall()
            except sqlite3.Error as exc:
                raise _translate(exc, self.location) from None
            for seq, body, digest, step_id, phase, attempt in rows:
                yield Record(run_id, seq, bytes(body), bytes(digest), step_id, phase, attempt)
            if len(rows) < READ_PAGE_ROWS:
                return
            after_seq = rows[-1][0]

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
