"""The SQLite journal: WAL, ``synchronous=FULL``, one owner per run (``effectlog.journal.ownership``).

Many processes may write one journal file at once, each driving its own runs: every
append is one ``BEGIN IMMEDIATE`` transaction, and a run is written only by the
claim that holds its OS lock on the database file (``effectlog.journal.filelocks``).
The file is opened by its real path (symlinks, ``./`` and ``..`` resolved) and refused
when it has a second name (a hard link): SQLite keeps its WAL beside the name it was
given, so two names would be two journals over one file.

Append-only is enforced by the database (triggers abort UPDATE and DELETE), and
deduplication is a constraint (schema v2: rowid ``run << 32 | seq``, unique
``(run, step_id, phase, attempt)``, the run's number from ``runs``), never a check
before the insert. Readers read a v1 file as it is; a writer migrates it
(``sqlite_schema``).

Closed runs may carry a seal (``effectlog.seal``) in the append-only ``seals``
table, written in the same transaction as the closing event and bound to it by the
chain. Seals are derived data, not part of the event schema: a writer adds the
table if it is missing (older journals), readers treat a missing table as "no
seals", so the schema version does not change.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from itertools import chain as chained
from itertools import starmap
from pathlib import Path
from typing import Any

from effectlog.chain import GENESIS, Chain
from effectlog.errors import (
    ChainBroken,
    EventConflict,
    JournalAliased,
    JournalRemoved,
    JournalUnreadable,
    JournalWalLost,
    RunOwned,
    SequenceGap,
    StorageError,
)
from effectlog.events import PLAIN_STEP_PHASE, Event, encode_direct
from effectlog.fold import Record, Row
from effectlog.journal import checkpoint, filelocks, rescue, sidecars
from effectlog.journal.bindings import check_binding, lease_holder
from effectlog.journal.keycheck import FINGERPRINT_KEY, LastLink, check_key
from effectlog.journal.ownership import (
    PASSING_WAIT_S,
    Claim,
    Fence,
    InheritedHolder,
    Owner,
    OwnerStatus,
    decode_owner,
    describe,
    encode_owner,
    new_owner,
    plausible,
    this_host,
)
from effectlog.journal.sqlite_schema import (
    INSERT,
    INSERT_FINGERPRINT,
    INSERT_SEAL,
    LAYOUTS,
    META_KEYS,
    MIGRATIONS,
    NEW_RUN,
    OWNERS_DDL,
    READ_PAGE_ROWS,
    RUN_NUMBER,
    RUN_NUMBERING,
    RUN_TOPS,
    RUN_TRACES,
    SEALS_DDL,
    SQLITE_SCHEMA_VERSION,
    UPSERT_OWNER,
    WAL_AUTOCHECKPOINT_PAGES,
    Durability,
    file_size,
    insert_rows,
    translate,
)
from effectlog.journal.walwatch import WalWatch, switch_to_wal

# ``_append_owned``'s statements: ``INSERT`` with one ``VALUES`` tuple per row (as the PostgreSQL journal
# builds its batches), for 1 to 64 rows (a group commit of 32 runs holds at most 64); larger batches go
# through ``_transact``.
_INSERT_ROWS: dict[int, str] = {count: insert_rows(count) for count in range(1, 65)}


class SqliteJournal:
    """A journal in one SQLite file. ``writer=False`` opens it read-only (it must exist)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        writer: bool = True,
        chain: Chain | None = None,
        durability: Durability = "full",
        busy_timeout_s: float = 60.0,
    ) -> None:
        checkpoint.check_setting()
        self.location = str(path)
        self.busy_timeout_s = busy_timeout_s
        # Every name of the file leads to one path, so to one WAL and one set of locks.
        self.path = os.path.realpath(self.location)
        self.chain = chain or Chain()
        self.writer = writer
        self._heads: dict[str, tuple[int, bytes]] = {}  # only for runs this object holds a claim on
        # Run numbers (schema v2's ``runs``), committed ones only: a number is never reused or renamed.
        self._numbers: dict[str, int] = {}
        self._layout = LAYOUTS[SQLITE_SCHEMA_VERSION]  # the file's (``_migrate``)
        self._claims: dict[str, Claim] = {}
        self._unnamed: set[str] = set()  # claimed runs whose owner row is not written yet (first append does)
        # Test hook: called inside the transaction, after the rows are written, before COMMIT.
        self.before_commit: Callable[[Sequence[Event]], None] | None = None
        self._file: filelocks.SharedFile | None = None
        self._wal: WalWatch | None = None
        sidecars.refuse_clash(self.location, "journal")  # before SQLite takes another file for its own
        if not writer and not Path(self.path).is_file():
            raise JournalUnreadable(f"{self.location}: no journal file there")
        if writer:
            self._create_private(self.path)
        try:
            self._file = filelocks.acquire(self.path, write=writer)
        except PermissionError as exc:
            raise StorageError(f"{self.location}: journal is read-only ({exc.strerror})") from None
        except OSError as exc:
            raise StorageError(f"{self.location}: cannot open the journal ({exc.strerror})") from None
        try:
            self._refuse_aliases()
            self._file.use_name(self.path)
            self._db = self._connect(durability)
            filelocks.opened(self._db, self.path)
            self._cursor = self._db.cursor()  # reused by append: one cursor instead of one per row
            self._migrate()
            if writer:
                self._ensure_table("seals", SEALS_DDL)
                self._ensure_table("owners", OWNERS_DDL)
                self._ensure_table("checkpoints", checkpoint.SQLITE_DDL)
                self._wal = WalWatch(self.path)  # checked before each commit: _refuse_if_moved
        except BaseException:
            with contextlib.suppress(Exception):
                if filelocks.may_close(self._db):
                    self._db.close()
            filelocks.release(self._file)
            self._file = None
            raise

    def _refuse_aliases(self) -> None:
        assert self._file is not None
        second = filelocks.second_name(self._file, self.path)
        if second is not None:
            raise JournalAliased(
                f"{self.location}: the journal file {second}; SQLite keeps its WAL beside the name it is opened "
                "by, so two names would be two journals over one file: remove the extra link(s), or open it by "
                "the name in use (a symlink is fine)"
            )

    def _moved(self) -> bool:
        """Whether the name this journal was opened by no longer leads to its file (renamed or removed)."""
        assert self._file is not None
        return filelocks.name_moved(self.path, self._file.key)

    def _refuse_if_moved(self) -> None:
        """SQLite keeps the WAL beside the old name and never checkpoints a moved file on close: the
        history written since the last checkpoint would be lost to the file under its new name. So
        checkpoint it into the file now, and write no more under a name that is gone."""
        assert self._file is not None
        try:  # _moved, inline: this runs before every commit
            st: os.stat_result | None = os.stat(self.path)
        except OSError:
            st = None
        key = self._file.key
        if st is not None and st.st_ino == key[1] and st.st_dev == key[0]:
            wal = self._wal  # a lost WAL refuses every later commit (_wal_lost)
            if wal is None or not wal.lost(True):  # (in the writers' gate: one thread at a time asks)
                return
            if wal.foreign():
                filelocks.pin_no_checkpoint(self._file)  # see close
            raise self._wal_lost()
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        if rescue.orphaned(self._file.fd):
            raise self._removed()
        raise JournalAliased(
            f"{self.location}: the journal file was renamed while this process had it open; what was written "
            "is kept in the file (checkpointed), and nothing more is written: open it by its new name"
        )

    def _removed(self) -> JournalRemoved:
        """The journal file has no name left (removed, or another file renamed over it) while this process
        has it open: its history is only here, so it is saved (``rescue``) before anything else, and this
        connection never checkpoints on close (its close would delete the WAL at the name, another file's
        by then)."""
        assert self._file is not None
        filelocks.pin_no_checkpoint(self._file)
        try:
            saved, back = rescue.save(self._db, self.path)
        except (OSError, sqlite3.Error) as exc:
            return JournalRemoved(
                f"{self.location}: the journal file was removed or replaced while this process had it open, and "
                f"its history could not be saved ({exc}); nothing more is written by this process, and what it "
                "wrote is lost when it ends"
            )
        if back:
            return JournalRemoved(
                f"{self.location}: the journal file was removed while this process had it open; its history, as "
                "this process last wrote it, is put back at that name, and nothing more is written by this "
                "process: run the command again"
            )
        return JournalRemoved(
            f"{self.location}: the journal file was replaced by another file while this process had it open; "
            f"its history, as this process last wrote it, is saved at {saved}, and the file now at "
            f"{self.location} does not hold it (a run there would not know what this one did): put the saved "
            "file back at that name before running again"
        )

    def _wal_lost(self) -> JournalWalLost:
        """While this connection is open, SQLite's shared lock on the file keeps any other process from
        deleting the WAL beside it. Closing any descriptor of the file in this process drops that lock
        (a tool that reads the journal file, say); another process's last close then checkpoints and
        deletes the WAL, and this connection would go on committing into the deleted one: commits
        nobody else sees, lost when this process ends while others have the file open. So a WAL that
        is gone or another file refuses every later commit: checked in ``_refuse_if_moved`` (``walwatch``,
        shared with the effect store)."""
        return JournalWalLost(
            f"{self.location}: the journal's WAL or shared-memory index (-wal, -shm) was removed or replaced while "
            "this process had it open (something removed the file, or this process's SQLite locks on the journal "
            "were dropped: something in it opened and closed the journal file); nothing more is written by this "
            "process: run the command again"
        )

    @staticmethod
    def _create_private(path: str) -> None:
        """A new journal file is created readable by its owner only (0600)."""
        if file_size(path + "-wal") and not file_size(path):
            # SQLite would replay a stray WAL into a new or empty file: history that is not this journal's.
            raise JournalUnreadable(f"{path}-wal: a WAL without its database; restore {path} or move the WAL away")
        try:
            filelocks.create_empty(path)  # closed before another thread's SQLite opens it (see create_empty)
        except OSError as exc:
            raise StorageError(f"{path}: cannot create the journal ({exc.strerror})") from None

    def _connect(self, durability: Durability) -> sqlite3.Connection:
        try:
            if self.writer:
                db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                db.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
                try:  # before the switch to WAL, which writes the file: an application's database stays as it was
                    self._version(db)
                except BaseException:
                    db.close()
                    raise
                mode = switch_to_wal(db, self.busy_timeout_s)
                if mode != "wal":
                    raise StorageError(f"{self.location}: could not switch the journal to WAL (got {mode})")
                # FULL: a committed append survives power loss. NORMAL is an explicit, unsafe opt-in.
                db.execute(f"PRAGMA synchronous = {'FULL' if durability == 'full' else 'NORMAL'}")
                # Checkpoints run inside a commit and sync the database file too. A group commit
                # of many runs dirties a few pages per run, so the default (1,000 pages) made
                # every few commits pay for one. Durability does not depend on it: the WAL is.
                db.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
            else:
                uri = Path(self.path).as_uri() + "?mode=ro"
                db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
                db.execute("PRAGMA busy_timeout = 5000")
                db = self._read_only_directory(db, uri)
        except sqlite3.Error as exc:
            raise translate(exc, self.location) from None
        return db

    def _read_only_directory(self, db: sqlite3.Connection, uri: str) -> sqlite3.Connection:
        """A reader of a WAL database needs its ``-shm``, which SQLite cannot make in a directory it may not
        write (an archive, a snapshot, a read-only volume): status and verify of a journal kept there
        failed ("attempt to write a readonly database"). With no WAL beside the file, the file alone
        holds the whole history (the last close checkpointed it), so it is read as it is, ``immutable``;
        a WAL there (a writer that can write the directory, or one killed) is still refused."""
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return db
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorname != "SQLITE_READONLY_DIRECTORY" or os.path.lexists(self.path + "-wal"):
                raise
        db.close()
        db = sqlite3.connect(uri + "&immutable=1", uri=True, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA busy_timeout = 5000")
        return db

    def _version(self, db: sqlite3.Connection | None = None) -> int:
        db = db or self._db
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return 0
        if "meta" not in tables or "events" not in tables:
            raise JournalUnreadable(f"{self.location}: not an effectlog journal (unexpected tables)")
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None or not (str(row[0]).isascii() and str(row[0]).isdigit()):  # not ²
            raise JournalUnreadable(f"{self.location}: not an effectlog journal (no schema version)")
        version = int(row[0])
        # An application's own ``meta`` and ``events`` tables (a common pair of names) are no journal:
        # taken for one, the writer added its tables to that database before failing on a missing column.
        columns = [r[0] for r in db.execute("SELECT name FROM pragma_table_info('events')")]
        layout = LAYOUTS.get(version)
        if layout is not None and columns != layout.columns:
            raise JournalUnreadable(f"{self.location}: not an effectlog journal (its events table is another's)")
        return version

    def _migrate(self) -> None:
        try:
            version = self._version()
            if version > SQLITE_SCHEMA_VERSION:
                raise JournalUnreadable(
                    f"{self.location}: journal schema v{version} is newer than this effectlog "
                    f"(v{SQLITE_SCHEMA_VERSION}); upgrade effectlog to read it"
                )
            if version == SQLITE_SCHEMA_VERSION or (version > 0 and not self.writer):
                # A reader reads the file's own layout as it is: no migration, no write.
                self._layout = LAYOUTS[version]
                if self._check_chain(version) and self.writer:
                    self._record_fingerprint()
                return
            if not self.writer:
                raise JournalUnreadable(f"{self.location}: no journal there yet (the database is empty)")
            # A writer brings the file to the current layout in one transaction: all of it or none.
            self._db.execute("BEGIN IMMEDIATE")
            try:
                version = self._version()  # another writer may have migrated while this one waited
                if version == SQLITE_SCHEMA_VERSION:
                    self._db.execute("COMMIT")
                    if self._check_chain(version):
                        self._record_fingerprint()
                    return
                # A journal opened with the wrong key is not rewritten; a new one records its key.
                record = self._check_chain(version) if version > 0 else self.chain.key is not None
                for statements in MIGRATIONS[version:]:
                    for sql in statements:
                        self._db.execute(sql)
                self._db.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SQLITE_SCHEMA_VERSION),),
                )
                if version == 0:
                    self._db.execute("INSERT INTO meta (key, value) VALUES ('chain', ?)", (self.chain.name,))
                if record:
                    self._db.execute(INSERT_FINGERPRINT, (self.chain.fingerprint(),))
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # SQLite ends a transaction itself on some errors (a full disk)
                    self._db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise translate(exc, self.location) from None

    def _check_chain(self, version: int) -> bool:
        """Refuse another chain kind or another key (``keycheck``); True: record this key's fingerprint."""
        stored = dict(self._db.execute(META_KEYS).fetchall())
        fingerprint = stored.get(FINGERPRINT_KEY)
        last = None
        if self.chain.key is not None and fingerprint != self.chain.fingerprint():  # else no read
            row = self._db.execute(LAYOUTS[version].last_link).fetchone()
            if row is not None:
                prev = None if row[2] is None else bytes(row[2])
                last = LastLink(str(row[0]), int(row[1]), prev, bytes(row[3]), bytes(row[4]))
        return check_key(self.location, self.chain, stored.get("chain"), fingerprint, last)

    def _record_fingerprint(self) -> None:
        """A keyed journal from before the fingerprint, its key checked: record it (one meta row added, in a
        transaction that checks again, so two writers with two keys on an empty journal cannot both pass)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if self._check_chain(self._version()):
                self._db.execute(INSERT_FINGERPRINT, (self.chain.fingerprint(),))
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def _ensure_table(self, name: str, ddl: Sequence[str]) -> None:
        """Add a derived table (seals, owners) that older journals lack; no schema version change."""
        exists = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
        try:
            if self._db.execute(exists, (name,)).fetchone():
                return
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if not self._db.execute(exists, (name,)).fetchone():
                    for sql in ddl:
                        self._db.execute(sql)
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # SQLite ends a transaction itself on some errors (a full disk)
                    self._db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise translate(exc, self.location) from None

    # -- the Protocol -------------------------------------------------------------

    def head(self, run_id: str) -> tuple[int, bytes]:
        cached = self._heads.get(run_id)
        if cached is not None:
            return cached
        try:
            row = self._db.execute(self._layout.head, (run_id,)).fetchone()
            if row is None and self._layout.numbered:
                self._refuse_empty_number(run_id)
        except sqlite3.Error as exc:
            raise translate(exc, self.location) from None
        head = (row[0], bytes(row[1])) if row else (0, GENESIS)
        if run_id in self._claims:  # only the run's owner may trust a cached head: nobody else appends to it
            self._heads[run_id] = head
        return head

    def _refuse_empty_number(self, run_id: str) -> None:
        """A run's number is written with its first event and neither is ever removed: a number with no
        events means ``runs`` or ``events`` was changed by hand, and the run's history is elsewhere. Its
        head would read as a new run's (seq 0), whose steps would all be sent again: refuse instead."""
        row = self._db.execute(RUN_NUMBER, (run_id,)).fetchone()
        if row is not None:
            raise ChainBroken(
                f"the journal's runs table gives the run number {row[0]}, which has no events: the runs or "
                "events table was changed; the run is not driven from here (run verify)",
                run_id=run_id,
                column="runs.run",
            )

    def _number(self, run_id: str, created: list[str]) -> int:
        """The run's number (schema v2), inside the append's transaction; a new run's is added to
        ``runs`` here, with its first event, and named in ``created`` (forgotten if the batch rolls back)."""
        number = self._numbers.get(run_id)
        if number is not None:
            return number
        cursor = self._cursor
        row = cursor.execute(RUN_NUMBER, (run_id,)).fetchone()
        if row is None:
            self._check_numbering(run_id, dense=False)
            claim = self._claims.get(run_id)
            # A run's owner row (token > 1: named before this batch), seal and segments are written only
            # with its events: any of them for a run without a number is a run whose number was renamed.
            if (claim is not None and claim.token > 1) or cursor.execute(RUN_TRACES, (run_id, run_id)).fetchone():
                raise ChainBroken(
                    "the run has no events under its id, but its owner, seal or checkpoint rows say it ran: the "
                    "runs table was changed; the run is not started again (run verify)",
                    run_id=run_id,
                    column="runs.run_id",
                )
            row = cursor.execute(NEW_RUN, (run_id,)).fetchone()
            created.append(run_id)
        self._numbers[run_id] = number = int(row[0])
        return number

    def _check_numbering(self, run_id: str | None = None, *, dense: bool = True) -> None:
        """Run numbers are 1..n, never removed (``dense``: a count of every run), and no event lies past
        them; else ``runs`` was changed and a run's history is under no number or another's
        (``ChainBroken``, exit 7). A new run's number checks only the tops (``RUN_TOPS``)."""
        if dense:
            count, top, used = self._db.execute(RUN_NUMBERING).fetchone()
        else:
            top, used = self._db.execute(RUN_TOPS).fetchone()
            count = top
        if count != top or used > top:
            raise ChainBroken(
                f"the journal's runs table was changed ({count} run(s) numbered up to {top}, events up to run "
                f"number {used}): a run's history may be under no number or another's (run verify)",
                run_id=run_id,
                column="runs.run",
            )

    # -- ownership ----------------------------------------------------------------

    def claim(self, run_id: str, kind: str = "run", *, runner: str | None = None) -> Claim:
        """Take ``run_id`` for this object until ``release``; ``RunOwned`` (exit 6) if a live owner has it.

        The OS lock is the claim; the owner row that names it is written with the
        claim's first append (a run that is only looked at costs no commit).
        """
        if not self.writer:
            raise StorageError(f"{self.location}: journal opened read-only")
        claim = Claim(run_id=run_id, owner=new_owner(kind, runner))
        self._lock_run(run_id, claim)
        try:
            self._check_binding(run_id, kind)
        except BaseException:
            self._unlock_run(run_id, claim)
            raise
        self._claims[run_id] = claim
        self._unnamed.add(run_id)
        self._heads.pop(run_id, None)  # written by others until now
        return claim

    def release(self, claim: Claim) -> None:
        """Give the run up (its owner row stays, naming the last owner); safe to call twice."""
        if claim.released or self._claims.get(claim.run_id) is not claim:
            return
        claim.released = True
        del self._claims[claim.run_id]
        self._unnamed.discard(claim.run_id)
        self._heads.pop(claim.run_id, None)
        self._unlock_run(claim.run_id, claim)

    def owner(self, run_id: str, *, leases: bool = True) -> OwnerStatus:
        """The run's last recorded owner, and whether a live claim holds the run now; ``leases=False``: a
        claim only, not a fleet lease (a runner asking whether a process outside the fleet drives it)."""
        assert self._file is not None
        try:
            row = self._db.execute("SELECT holder FROM owners WHERE run_id = ?", (run_id,)).fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):  # a journal no writer has opened since owners exist
                raise translate(exc, self.location) from None
            row = None
        except sqlite3.Error as exc:
            raise translate(exc, self.location) from None
        runner = self._lease_holder(run_id) if leases else None
        if runner is not None:
            return OwnerStatus(owner=runner[0], live=True, waiting=runner[1])
        live = self._file.locked_anywhere(run_id)
        recorded = decode_owner(row[0]) if row else None
        return OwnerStatus(owner=self._live_owner(run_id, recorded) if live else recorded, live=live)

    def _live_owner(self, run_id: str, recorded: Owner | None) -> Owner | None:
        """Who holds the run's lock, for a message: the recorded owner while it may live; else a process
        that inherited its lock (``filelocks.lock_holders``); else unknown (``None``)."""
        found = plausible(recorded)
        if found is not None or self._file is None:
            return found
        holders = filelocks.lock_holders(self._file.key, filelocks.slot(run_id))
        if not holders:
            return None
        gone = f"its owner {recorded.kind} pid {recorded.pid} is gone; " if recorded is not None else ""
        return InheritedHolder(
            pid=holders[0], host=this_host(), kind="process",
            via=f"{gone}it holds the run's lock it inherited through fork(): the run is free once it ends",
        )  # fmt: skip

    def _lease_holder(self, run_id: str) -> tuple[Owner, bool] | None:
        try:
            if not self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'fleet_requests'").fetchone():
                return None
            return lease_holder(
                lambda sql, params: self._db.execute(sql, params).fetchall(),
                requests="fleet_requests",
                attempts="fleet_attempts",
                placeholder="?",
                run_id=run_id,
                now=time.time(),
            )
        except sqlite3.Error as exc:
            raise translate(exc, self.location) from None

    def _lock_run(self, run_id: str, claim: Claim) -> None:
        assert self._file is not None
        deadline = time.monotonic() + PASSING_WAIT_S
        while not self._file.try_lock(run_id, id(claim)):
            # Refused by an owner: say so at once. Refused by one-shot writers passing through
            # (an operator's decision, a transaction long): wait for them, briefly.
            if self._file.locked_anywhere(run_id) or time.monotonic() > deadline:
                break
            time.sleep(0.005)
        else:
            return
        raise RunOwned(
            f"the run is driven by {describe(self._recorded_owner(run_id, claim.owner))}; nothing was written",
            run_id=run_id,
        )

    def _unlock_run(self, run_id: str, claim: Claim) -> None:
        if self._file is not None:
            self._file.unlock(run_id, id(claim))

    def _recorded_owner(self, run_id: str, me: Owner) -> Owner | None:
        """Who holds the run, for the message: the owner row, or this process if it holds it itself."""
        assert self._file is not None
        if run_id in self._file.held:
            return Owner(pid=me.pid, host=me.host, kind="another actor in this process")
        with contextlib.suppress(sqlite3.Error):
            row = self._db.execute("SELECT holder FROM owners WHERE run_id = ?", (run_id,)).fetchone()
            return self._live_owner(run_id, decode_owner(row[0]) if row else None)
        return None

    def _check_binding(self, run_id: str, kind: str) -> None:
        try:
            if not self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'fleet_requests'").fetchone():
                return
            check_binding(
                lambda sql, params: self._db.execute(sql, params).fetchall(),
                requests="fleet_requests",
                attempts="fleet_attempts",
                placeholder="?",
                run_id=run_id,
                kind=kind,
                now=time.time(),
            )
        except sqlite3.Error as exc:
            raise translate(exc, self.location) from None

    # -- appends ------------------------------------------------------------------

    @checkpoint.forwards
    def append(self, events: Sequence[Event]) -> list[Record]:
        return self.append_sealed(events, ())

    @checkpoint.forwards
    def append_sealed(self, events: Sequence[Event], seals: Sequence[tuple[str, int, bytes]]) -> list[Record]:
        """``append``, plus seals of runs this batch closes, in the same transaction (``effectlog.seal``)."""
        return self.append_checkpointed(events, seals, ())

    def append_checkpointed(
        self,
        events: Sequence[Event],
        seals: Sequence[tuple[str, int, bytes]],
        checkpoints: Sequence[checkpoint.CheckpointRow],
    ) -> list[Record]:
        """``append``, plus seals of runs this batch closes and checkpoint segments of runs it
        advances (``effectlog.journal.checkpoint``), in the same transaction.

        A run this object holds a claim on is appended as its owner; any other run gets a
        one-shot claim for this transaction (an operator's decision), refused while a live
        owner drives it.
        """
        if not self.writer:
            raise StorageError(f"{self.location}: journal opened read-only")
        if not events and not seals:
            return []
        assert self._file is not None
        claims = self._claims
        for event in events:  # the owner's path (every run of the batch claimed here): no one-shot claims
            if event.run_id not in claims:
                break
        else:
            if not seals and not checkpoints and not self._unnamed and self.before_commit is None:
                done = self._append_owned(events)
                if done is not None:
                    return done
            if (not seals or all(seal[0] in claims for seal in seals)) and (
                not checkpoints or all(row[0] in claims for row in checkpoints)
            ):
                return self._transact(events, seals, checkpoints=checkpoints)
        one_shot: list[str] = []
        try:
            for run_id in sorted({e.run_id for e in events} | {s[0] for s in seals}):
                if run_id not in claims:
                    if not self._file.try_pass(run_id):
                        raise RunOwned(
                            f"the run is driven by {describe(self._recorded_owner(run_id, new_owner()))}; "
                            "nothing was written",
                            run_id=run_id,
                        )
                    one_shot.append(run_id)
            return self._transact(events, seals, one_shot=one_shot, checkpoints=checkpoints)
        finally:
            for run_id in one_shot:
                self._file.end_pass(run_id)

    def append_under(self, events: Sequence[Event], fence: Fence) -> list[Record]:
        """Append under another proof of ownership (a fleet lease), checked in the same transaction."""
        if not events:
            return []
        return self._transact(events, (), fence=fence)

    def _append_owned(self, events: Sequence[Event]) -> list[Record] | None:
        """A plain batch of claimed runs (each event its run's next, no seal, segment or owner row, no test
        hook) as one ``INSERT`` of all its rows, in autocommit: one statement is one transaction, atomic as
        ``BEGIN IMMEDIATE`` + inserts + ``COMMIT`` (a statement that writes takes the write lock as
        ``BEGIN IMMEDIATE`` does, through the same busy handler), with the same gate, the same moved-file
        and WAL checks before it, and the same rows; two statements fewer per commit (about 10k
        instructions each, BEGIN's and COMMIT's own in Python's sqlite3 and SQLite's VDBE).

        ``None``: not such a batch, or the insert was refused (rolled back with its statement, so nothing
        was written): ``_transact`` then appends it or names the refusal, as it does for every batch."""
        sql = _INSERT_ROWS.get(len(events))
        if sql is None:
            return None
        cached, numbers = self._heads, self._numbers
        heads: dict[str, tuple[int, bytes]] = {}
        params: list[Any] = []
        out: list[Record] = []
        chain, sha256, plain = self.chain, hashlib.sha256, PLAIN_STEP_PHASE
        link, keyed = chain.link, chain.key is not None
        for event, body in zip(events, map(encode_direct, events), strict=True):
            run_id, seq = event.run_id, event.seq
            head = heads.get(run_id) or cached.get(run_id)
            number = numbers.get(run_id)
            if head is None or seq != head[0] + 1 or number is None:
                return None  # a head or run number not known yet, a repeat or a gap: _transact's cases
            digest = link(head[1], body) if keyed else sha256(head[1] + body).digest()
            phase = plain.get(type(event))
            if phase is not None:  # a plain step event: its columns are these fields (``index_columns``)
                step: Any = event
                step_key, attempt = step.step_id, step.attempt
            else:
                step_key, phase, attempt = event.step_key, event.phase, event.attempt_no
            # bytearray, not bytes: see _transact
            params += (number, seq, step_key, phase, attempt, bytearray(body), bytearray(digest))
            heads[run_id] = (seq, digest)
            out.append(Record(run_id, seq, body, digest))
        shared, db = self._file, self._db
        assert shared is not None
        try:
            shared.enter(self.location, self.busy_timeout_s)  # the writers' gate (filelocks)
            try:
                self._refuse_if_moved()
                if db.in_transaction:
                    return None  # a transaction is open on this connection: the statement would join it
                try:
                    self._cursor.execute(sql, params)
                except sqlite3.IntegrityError:
                    return None  # a duplicate: nothing written; _transact names the row
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
            finally:
                shared.leave()
        except sqlite3.Error as exc:
            raise translate(exc, self.location) from None
        claims = self._claims
        for run_id, head in heads.items():
            if run_id in claims:  # (all were when the batch began; as _transact, trust no released run's head)
                cached[run_id] = head
        return out

    def _transact(
        self,
        events: Sequence[Event],
        seals: Sequence[tuple[str, int, bytes]],
        *,
        one_shot: Sequence[str] = (),
        fence: Fence | None = None,
        checkpoints: Sequence[checkpoint.CheckpointRow] = (),
    ) -> list[Record]:
        if not self.writer:
            raise StorageError(f"{self.location}: journal opened read-only")
        assert self._file is not None
        db = self._db
        heads: dict[str, tuple[int, bytes]] = {}
        out: list[Record] = []
        named: list[Claim] = []
        created: list[str] = []  # runs numbered in this transaction
        encoded = list(map(encode_direct, events))
        shared = self._file
        try:
            shared.enter(self.location, self.busy_timeout_s)  # the writers' gate (filelocks), left below
            try:
                self._refuse_if_moved()
                cursor = self._cursor  # BEGIN and COMMIT on the reused cursor: no new cursor per statement
                cursor.execute("BEGIN IMMEDIATE")
                try:
                    for run_id in one_shot:
                        self._check_binding(run_id, "operator")
                    if fence is not None and not fence.admit(db, events, encoded):
                        out = [self._existing(e.run_id, e.seq, b) for e, b in zip(events, encoded, strict=True)]
                        db.execute("COMMIT")
                        return out
                    named = self._write_owner_rows(events) if self._unnamed else []
                    # The hot path, bound once: an unkeyed chain's link without its Python frame (as fold_rows
                    # does), the claimed runs' cached heads (``head``'s first look), and the row's index
                    # columns by type (``events.index_columns``, inline: a dict lookup instead of a call).
                    chain, sha256 = self.chain, hashlib.sha256
                    link, keyed = chain.link, chain.key is not None
                    insert, plain, cached = cursor.execute, PLAIN_STEP_PHASE, self._heads
                    numbers, number_of = self._numbers, self._number
                    for event, body in zip(events, encoded, strict=True):
                        run_id, seq = event.run_id, event.seq
                        last_seq, last_hash = heads.get(run_id) or cached.get(run_id) or self.head(run_id)
                        if seq <= last_seq:
                            out.append(self._existing(run_id, seq, body))
                            continue
                        if seq != last_seq + 1:
                            raise SequenceGap(f"append expected seq {last_seq + 1}, got {seq}", run_id=run_id, seq=seq)
                        digest = link(last_hash, body) if keyed else sha256(last_hash + body).digest()
                        phase = plain.get(type(event))
                        try:
                            # bytearray, not bytes: sqlite3 looks each bytes parameter up in its adapter
                            # registry (two failed attribute lookups, one formatting an error message it
                            # drops); a bytearray is bound as the same BLOB without that (tests/test_sqlite_blobs.py).
                            if phase is not None:  # a plain step event: its columns are these fields
                                step: Any = event
                                step_key, attempt = step.step_id, step.attempt
                            else:
                                step_key, phase, attempt = event.step_key, event.phase, event.attempt_no
                            number = numbers.get(run_id) or number_of(run_id, created)
                            insert(INSERT, (number, seq, step_key, phase, attempt, bytearray(body), bytearray(digest)))
                        except sqlite3.IntegrityError:
                            raise self._dedup_conflict(event) from None
                        heads[run_id] = (seq, digest)
                        out.append(Record(run_id, seq, body, digest))
                    for run_id, seq, seal in seals:
                        self._insert_seal(run_id, seq, seal, heads.get(run_id) or self.head(run_id))
                    for row in checkpoints:
                        self._insert_checkpoint(row, heads.get(row[0]) or self.head(row[0]))
                    if fence is not None:
                        fence.written(db, events, encoded)
                    if self.before_commit is not None:
                        self.before_commit(events)
                    cursor.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    for claim in named:
                        claim.token = 0  # the owner row was rolled back with the batch: write it next time
                        self._unnamed.add(claim.run_id)
                    for run_id in created:  # its runs row was rolled back with the batch: not its number
                        self._numbers.pop(run_id, None)
                    raise
            finally:
                shared.leave()
        except sqlite3.Error as exc:
            raise translate(exc, self.location) from None
        for run_id, head in heads.items():
            if run_id in self._claims:
                self._heads[run_id] = head
        return out

    def _write_owner_rows(self, events: Sequence[Event]) -> list[Claim]:
        """Name each claim's owner in the owners table, with the claim's first append."""
        named: list[Claim] = []
        for event in events:
            claim = self._claims.get(event.run_id)
            if claim is not None and claim.token == 0:
                row = self._cursor.execute(UPSERT_OWNER, (event.run_id, encode_owner(claim.owner))).fetchone()
                claim.token = int(row[0])
                named.append(claim)
                self._unnamed.discard(claim.run_id)
        return named

    def _insert_seal(self, run_id: str, seq: int, seal: bytes, head: tuple[int, bytes]) -> None:
        if seq != head[0]:
            raise SequenceGap(
                f"a seal must follow the run's last event (seq {head[0]}), not seq {seq}", run_id=run_id, seq=seq
            )
        try:
            self._cursor.execute(INSERT_SEAL, (run_id, seq, seal, self.chain.link(head[1], seal)))
        except sqlite3.IntegrityError:
            row = self._db.execute("SELECT body FROM seals WHERE run_id = ?", (run_id,)).fetchone()
            if row is None or bytes(row[0]) != seal:
                raise EventConflict("the run is already sealed with another seal", run_id=run_id, seq=seq) from None

    def _insert_checkpoint(self, row: checkpoint.CheckpointRow, head: tuple[int, bytes]) -> None:
        if row[1] != head[0]:
            raise SequenceGap(
                f"a checkpoint must follow the run's last event (seq {head[0]}), not seq {row[1]}",
                run_id=row[0],
                seq=row[1],
            )
        cursor = self._cursor
        checkpoint.insert(
            lambda sql, params: cursor.execute(sql, params).fetchall(),
            "checkpoints",
            "?",
            chain=self.chain,
            row=row,
            event_hash=head[1],
        )

    def checkpoint_rows(self, run_id: str) -> list[tuple[int, bytes, bytes, bytes, bytes | None]]:
        """The run's checkpoint segments with their events' hashes, for ``checkpoint.load``; unchecked."""
        sql = checkpoint.select_sql("checkpoints", "events", "?", join=self._layout.checkpoint_join)
        return self._checkpoints(sql, (run_id,))

    def last_checkpoint_row(self, run_id: str) -> list[tuple[int, bytes, bytes, bytes, bytes | None]]:
        """The run's last checkpoint segment (``checkpoint_rows``' last row, or none), for a resume; unchecked."""
        sql = checkpoint.select_sql("checkpoints", "events", "?", last=True, join=self._layout.checkpoint_join)
        return self._checkpoints(sql, (run_id,))

    def stored_checkpoints(self, run_id: str) -> list[checkpoint.StoredSegment]:
        """The run's checkpoint rows as stored, ``(run id, seq, prev, body, hash)``; unchecked."""
        sql = "SELECT run_id, seq, prev, body, hash FROM checkpoints WHERE run_id = ? ORDER BY seq"
        return [(r[0], r[1], bytes(r[2]), bytes(r[3]), bytes(r[4])) for r in self._checkpoints(sql, (run_id,))]

    def checkpointed_runs(self) -> list[tuple[str, int]]:
        """Each run that has segments, with its last segment's seq; unchecked."""
        sql = "SELECT run_id, max(seq) FROM checkpoints GROUP BY run_id ORDER BY run_id"
        return [(str(r[0]), int(r[1])) for r in self._checkpoints(sql, ())]

    def _checkpoints(self, sql: str, params: tuple[str, ...]) -> list[tuple[Any, ...]]:
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):  # a journal no writer has opened since checkpoints exist
                return []
            raise translate(exc, self.location) from None
        except sqlite3.Error as exc:
            raise translate(exc, self.location) from None

    def sealed(self, run_id: str) -> tuple[bytes, bytes] | None:
        """``(seal, chain head)`` when the run's seal is bound to its last event; ``None`` otherwise."""
        try:
            row = self._db.execute(self._layout.select_seal, (run_id,)).fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):  # a journal no writer has opened since seals exist
                return None
            raise translate(exc, self.location) from None
        except sqlite3.Error as exc:
            raise translate(exc, self.location) from None
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
            raise translate(exc, self.location) from None
        except sqlite3.Error as exc:
            raise translate(exc, self.location) from None

    def _existing(self, run_id: str, seq: int, body: bytes) -> Record:
        row = self._db.execute(self._layout.existing, (run_id, seq)).fetchone()
        if row is None or bytes(row[0]) != body:
            raise EventConflict("a different event is already recorded at this seq", run_id=run_id, seq=seq)
        return Record(run_id, seq, bytes(row[0]), bytes(row[1]))

    def _dedup_conflict(self, event: Event) -> EventConflict:
        row = self._db.execute(
            self._layout.dedup,
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
        record = partial(Record, run_id)
        for rows in self._pages(run_id, after_seq):
            yield from starmap(record, rows)  # BLOBs come back as bytes

    def read_rows(self, run_id: str, after_seq: int = 0) -> Iterator[Row]:
        """``read``'s rows as ``fold.fold_rows`` takes them, without a ``Record`` per row (``verify``,
        ``load_run``: about a tenth of a replay's reading)."""
        return chained.from_iterable(self._pages(run_id, after_seq))

    def _pages(self, run_id: str, after_seq: int) -> Iterator[list[Row]]:
        sql = self._layout.read_page
        while True:
            try:
                rows: list[Row] = self._db.execute(sql, (run_id, after_seq, READ_PAGE_ROWS)).fetchall()
            except sqlite3.Error as exc:
                raise translate(exc, self.location) from None
            yield rows
            if len(rows) < READ_PAGE_ROWS:
                return
            after_seq = rows[-1][0]

    def first_body(self, run_id: str) -> bytes | None:
        """The body of the run's first event, one row read (``verify``'s look at the request a run serves:
        ``read``'s first page is up to 2,000 rows)."""
        try:
            row = self._db.execute(self._layout.existing, (run_id, 1)).fetchone()
        except sqlite3.Error as exc:
            raise translate(exc, self.location) from None
        return bytes(row[0]) if row is not None else None

    def runs(self) -> list[str]:
        try:
            if self._layout.numbered:  # every run's rows are under a listed number (``_check_numbering``)
                self._check_numbering()
            return [r[0] for r in self._db.execute(self._layout.list_runs)]
        except sqlite3.Error as exc:
            raise translate(exc, self.location) from None

    def close(self) -> None:
        for claim in list(self._claims.values()):
            self.release(claim)
        if self._file is not None and not filelocks.may_close(self._db):
            self._file = None  # opened before fork(): SQLite's close here is the parent's (filelocks)
            return
        if self.writer and self._file is not None and self._moved():
            with contextlib.suppress(sqlite3.Error):  # see _refuse_if_moved
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        if self._wal is not None and self._file is not None and self._wal.foreign():
            filelocks.pin_no_checkpoint(self._file)  # its checkpoint on close would drop others' commits
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        if self._file is not None:  # after the connection: closing the descriptor drops SQLite's locks too
            filelocks.release(self._file)
            self._file = None

    def __enter__(self) -> SqliteJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
