"""The effect store: a separate SQLite file standing in for an external tool.

``effects.idempotent`` stores the effect and its receipt in ONE transaction keyed by
the idempotency key (unique) and returns the stored receipt on a repeat.
``effects.control`` writes an effect on every call, with no deduplication, recording
run, step and attempt beside it so an operator (or ``lookup``) can inspect the ledger.
The crash matrix counts effects here, never in the journal.

A store carries an id, written into it when it is created (``effect_store`` table);
a run pins that id in ``run.started``, so evidence is only ever read from the run's
own store. A key arriving again with another body is ``IdempotencyConflict``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from effectlog.adapters.protocol import Evidence, Receipt, Request, check_same_body
from effectlog.canonical import digest
from effectlog.errors import (
    BadInput,
    IdempotencyConflict,
    StorageError,
    StoreAliased,
    StoreRemoved,
    StoreWalLost,
)
from effectlog.events import EffectStoreIdentity
from effectlog.journal import filelocks, rescue, sidecars
from effectlog.journal.walwatch import WalWatch, switch_to_wal

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS effects (
        effect_id INTEGER PRIMARY KEY,
        kind TEXT NOT NULL,
        run_id TEXT NOT NULL,
        step_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        idempotency_key TEXT NOT NULL,
        args_digest TEXT NOT NULL,
        created_ns INTEGER NOT NULL,
        receipt TEXT NOT NULL
    )""",
    "CREATE UNIQUE INDEX IF NOT EXISTS effects_key ON effects (idempotency_key) WHERE kind = 'idempotent'",
    "CREATE INDEX IF NOT EXISTS effects_step ON effects (run_id, step_id, attempt)",
    "CREATE TABLE IF NOT EXISTS effect_store (store_id TEXT NOT NULL, created_ns INTEGER NOT NULL)",
)
_COLUMNS = {"effect_id", "kind", "run_id", "step_id", "attempt", "idempotency_key", "args_digest", "receipt"}


def _has_placeholders(args: Any) -> bool:
    """Whether ``args`` hold a secret arg as the journal keeps it (``{"$secret_sha256": ...}``, ``Plan.pinned``):
    their digest is not the one the store computed from the real value."""
    return isinstance(args, dict) and any(isinstance(v, dict) and "$secret_sha256" in v for v in args.values())


class EffectRow(msgspec.Struct, frozen=True, kw_only=True):
    effect_id: int
    kind: str
    run_id: str
    step_id: str
    attempt: int
    idempotency_key: str
    args_digest: str
    created_ns: int
    receipt: Any


class EffectStore:
    """One SQLite file (WAL, synchronous=FULL), opened per process."""

    def __init__(self, path: str | os.PathLike[str], *, read_only: bool = False) -> None:
        self.path = str(path)
        self.read_only = read_only
        # One connection, shared by the adapter threads of concurrent runs: one transaction at a time.
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._file: filelocks.SharedFile | None = None
        self._wal: WalWatch | None = None  # a writer's: looked at before each commit (_refuse_if_renamed)
        # SQLite resolves symlinks to name the WAL: locks and names go by the same resolved path.
        self._real = os.path.realpath(self.path)
        sidecars.refuse_clash(self.path, "effect store")  # before SQLite takes another file for its own
        filelocks.refuse_inherited(self.path)  # a file the parent had open at fork(): see filelocks
        if read_only and not Path(self.path).is_file():
            raise BadInput(f"{self.path}: no effect store there")
        if not read_only and not Path(self.path).exists():
            try:
                filelocks.create_empty(self.path)  # closed before another thread's SQLite opens it (see create_empty)
            except OSError as exc:
                raise StorageError(f"{self.path}: cannot create the effect store ({exc.strerror})") from None
        try:
            self._file = filelocks.acquire(self._real, write=not read_only)
        except OSError as exc:
            raise StorageError(f"{self.path}: cannot open the effect store ({exc.strerror})") from None
        try:
            self._refuse_aliases()
            self._file.use_name(self._real)
            if read_only:
                self._db = self._open_read_only()
                filelocks.opened(self._db, self.path)
                self.store_id = self._read_store_id()
                return
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
            filelocks.opened(self._db, self.path)
            self._refuse_foreign()
            switch_to_wal(self._db, 30)
            self._db.execute("PRAGMA synchronous = FULL")
            for sql in _SCHEMA:
                self._db.execute(sql)
            self._wal = WalWatch(self._real)
            with self._immediate() as db:
                if db.execute("SELECT count(*) FROM effect_store").fetchone()[0] == 0:
                    db.execute(
                        "INSERT INTO effect_store (store_id, created_ns) VALUES (?, ?)",
                        ("es-" + uuid.uuid4().hex, time.time_ns()),
                    )
            self.store_id = self._read_store_id()
        except sqlite3.Error as exc:
            self.close()
            raise StorageError(f"{self.path}: cannot open the effect store ({exc})") from None
        except BaseException:
            self.close()
            raise

    @property
    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StorageError(f"{self.path}: the effect store is closed")
        return self._db

    def _refuse_foreign(self) -> None:
        """A SQLite file holding tables and no effects ledger (the journal, a user's own database) is
        refused before a PRAGMA or a table is written to it: the CLI's ``--effects`` check, here so that
        every caller of the API gets it."""
        tables = {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and "effects" not in tables:
            raise BadInput(f"{self.path}: a SQLite file of something else, not an effect store; nothing was written")

    def _refuse_aliases(self) -> None:
        """A store file with a second name is refused before anything is read or written
        (``filelocks.second_name``: a hard link, a bind mount, a rename while another process has it open).

        SQLite keeps the WAL beside the name it was given: an effect committed through one name and not
        yet checkpointed is not seen through the other, so an idempotency key would be applied again,
        and a ledger inspection would say "not applied" for an effect that exists.
        """
        assert self._file is not None
        second = filelocks.second_name(self._file, self._real)
        if second is not None:
            raise StoreAliased(
                f"{self.path}: the effect store file {second}; SQLite keeps its WAL beside the name it is opened "
                "by, so effects committed under another name would be missed. Remove the extra link(s), or open "
                "it by the name in use (a symlink is fine); nothing was written"
            )

    def _open_read_only(self) -> sqlite3.Connection:
        """Open without writing a byte: no PRAGMA, no schema; refuse a file that is not an effect store."""
        uri = "file:" + urllib.parse.quote(os.path.abspath(self.path)) + "?mode=ro"
        try:
            db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=30)
            columns = {r[1] for r in db.execute("PRAGMA table_info(effects)").fetchall()}
        except sqlite3.Error as exc:
            raise BadInput(f"{self.path}: not an effect store ({exc})") from None
        if not _COLUMNS <= columns:
            db.close()
            raise BadInput(f"{self.path}: not an effect store (it has no effects ledger); nothing was written to it")
        return db

    def _read_store_id(self) -> str:
        """The id written when the store was created ("" for a store older than store ids, read-only)."""
        try:
            row = self._conn.execute("SELECT store_id FROM effect_store ORDER BY rowid LIMIT 1").fetchone()
        except sqlite3.OperationalError:
            return ""  # no effect_store table: a store created before ids existed, opened read-only
        return str(row[0]) if row is not None else ""

    @property
    def identity(self) -> EffectStoreIdentity:
        """What a run pins: the id written into the store, and the path it was opened at."""
        return EffectStoreIdentity(store_id=self.store_id, path=self.path)

    @contextlib.contextmanager
    def _immediate(self) -> Iterator[sqlite3.Connection]:
        """One write transaction at a time (adapter threads share the connection); rolled back on any error."""
        with self._lock:
            db = self._conn
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                self._refuse_if_renamed()
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def _refuse_if_renamed(self) -> None:
        """Refuse to commit an effect where the store's next reader would not see it.

        - Renamed or removed since it was opened: the WAL stays beside the old name, which nobody opens
          any more (a writer killed now orphans its effects there, and their keys are applied again
          through the new name). What was committed is checkpointed into the file first, and nothing
          more is written (as the journal does).
        - The WAL removed or replaced by another process (``journal.walwatch``; the journal looks the
          same way): an effect committed into it is lost when this process ends.
        """
        assert self._file is not None
        assert self._db is not None
        if filelocks.name_moved(self._real, self._file.key):
            self._db.execute("ROLLBACK")
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            if rescue.orphaned(self._file.fd):
                raise self._removed()
            raise StoreAliased(
                f"{self.path}: the effect store file was renamed while this process had it open; the effects "
                "committed so far are kept in the file (checkpointed), this one was not committed, and nothing "
                "more is written by this process: open it by its new name"
            )
        if self._wal is not None and self._wal.lost():
            if self._wal.foreign():
                filelocks.pin_no_checkpoint(self._file)  # see SqliteJournal.close
            raise StoreWalLost(
                f"{self.path}: the effect store's WAL or shared-memory index (-wal, -shm) was removed or replaced "
                "while this process had it open (something removed the file, or this process's SQLite locks on the "
                "store were dropped: something in it opened and closed the store file); the effect was not "
                "committed and nothing more is written by this process"
            )

    def _removed(self) -> StoreRemoved:
        """The store file has no name left (removed, or another file renamed over it): its effects are only
        here, so they are saved as the journal saves its history (``journal.rescue``), and this connection
        never checkpoints on close (its close would delete the WAL at the name, another file's by then)."""
        assert self._file is not None
        assert self._db is not None
        filelocks.pin_no_checkpoint(self._file)
        head = f"{self.path}: the effect store file was removed or replaced while this process had it open"
        try:
            saved, back = rescue.save(self._db, self._real)
        except (OSError, sqlite3.Error) as exc:
            return StoreRemoved(
                f"{head}, and its effects could not be saved ({exc}); this effect was not committed, and nothing "
                "more is written by this process"
            )
        where = "put back at that name" if back else f"saved at {saved} (put it back at {self.path})"
        return StoreRemoved(
            f"{head}; the effects committed so far are {where}, this one was not committed, and nothing more is "
            "written by this process"
        )

    def apply_idempotent(self, request: Request) -> Receipt:
        """Effect and receipt in ONE transaction keyed by the idempotency key; a repeat returns the receipt."""
        with self._immediate() as db:
            row = db.execute(
                "SELECT receipt, args_digest FROM effects WHERE kind = 'idempotent' AND idempotency_key = ?",
                (request.idempotency_key,),
            ).fetchone()
            if row is not None:
                check_same_body(request, row[1], where=f"effect store {self.path}")
                return Receipt(data={**msgspec.json.decode(row[0]), "replayed": True})
            data = self._insert("idempotent", request)
        return Receipt(data=data)

    def apply_control(self, request: Request) -> Receipt:
        """An effect on every call: no deduplication (run, step and attempt recorded beside it)."""
        with self._immediate() as db:
            del db
            data = self._insert("control", request)
        return Receipt(data=data)

    def _insert(self, kind: str, request: Request) -> dict[str, Any]:
        cur = self._conn.execute(
            "INSERT INTO effects (kind, run_id, step_id, attempt, idempotency_key, args_digest, created_ns, receipt)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, '')",
            (
                kind,
                request.run_id,
                request.step_id,
                request.attempt,
                request.idempotency_key,
                digest(request.args),
                time.time_ns(),
            ),
        )
        effect_id = cur.lastrowid
        data = {"effect_id": effect_id, "kind": kind}
        # The receipt is part of the same transaction as the effect (UPDATE of our own row, same txn).
        self._conn.execute("UPDATE effects SET receipt = ? WHERE effect_id = ?", (msgspec.json.encode(data), effect_id))
        return data

    def lookup(self, request: Request, *, body: str | None = None) -> Evidence:
        """Whether this attempt's effect is in the ledger. A row of another body under the same run,
        step and attempt (the run id reused in another journal with other args) is another request's
        effect, no evidence for this one: ``IdempotencyConflict``. ``body``: the request's args digest
        when ``request.args`` hold secret placeholders (the journal's ``args_digest``); without it,
        such a request's body is not compared."""
        rows = self.rows(run_id=request.run_id, step_id=request.step_id, attempt=request.attempt)
        if body is None and request.args_digest:
            body = request.args_digest  # rebuilt from the journal: the digest of the real args
        wanted = body if body is not None else (None if _has_placeholders(request.args) else digest(request.args))
        mine = [r for r in rows if wanted is None or not r.args_digest or r.args_digest == wanted]
        if rows and not mine:
            assert wanted is not None
            raise IdempotencyConflict(
                f"ledger {self.path}: the effect recorded for this run, step and attempt has another body (args "
                f"digest {rows[0].args_digest[:12]}, this request {wanted[:12]}): another request under the same "
                "run id (another journal?), no evidence for this one; nothing was recorded: reconcile by hand",
                run_id=request.run_id,
                step_id=request.step_id,
            )
        if mine:
            ids = ", ".join(f"#{r.effect_id}" for r in mine)
            return Evidence(applied=True, detail=f"ledger {self.path}: effect {ids} recorded for this attempt")
        return Evidence(applied=False, detail=f"ledger {self.path}: no effect recorded for this attempt")

    def missing_keys(self, keys: set[str]) -> set[str]:
        """Which of these idempotency keys no effect in the ledger was made under (one pass over the ledger)."""
        missing = set(keys)
        try:
            for (key,) in self._conn.execute("SELECT idempotency_key FROM effects"):
                missing.discard(key)
                if not missing:
                    break
        except sqlite3.Error as exc:
            raise StorageError(f"{self.path}: cannot read the effects ledger ({exc})") from None
        return missing

    def rows(
        self, *, run_id: str | None = None, step_id: str | None = None, attempt: int | None = None
    ) -> list[EffectRow]:
        sql = (
            "SELECT effect_id, kind, run_id, step_id, attempt, idempotency_key, args_digest, created_ns, receipt"
            " FROM effects"
        )
        where, params = [], []
        for col, val in (("run_id", run_id), ("step_id", step_id), ("attempt", attempt)):
            if val is not None:
                where.append(f"{col} = ?")
                params.append(val)
        if where:
            sql += " WHERE " + " AND ".join(where)
        try:
            cur = self._conn.execute(sql + " ORDER BY effect_id", params)
            return [
                EffectRow(
                    effect_id=r[0],
                    kind=r[1],
                    run_id=r[2],
                    step_id=r[3],
                    attempt=r[4],
                    idempotency_key=r[5],
                    args_digest=r[6],
                    created_ns=r[7],
                    receipt=msgspec.json.decode(r[8]) if r[8] else None,
                )
                for r in cur.fetchall()
            ]
        except sqlite3.Error as exc:
            raise StorageError(f"{self.path}: cannot read the effect store ({exc})") from None

    def run_ids(self) -> list[str]:
        """The runs the ledger holds effects of, sorted."""
        try:
            return [r[0] for r in self._conn.execute("SELECT DISTINCT run_id FROM effects ORDER BY run_id")]
        except sqlite3.Error as exc:
            raise StorageError(f"{self.path}: cannot read the effect store ({exc})") from None

    def count(self, *, run_id: str | None = None, step_id: str | None = None) -> int:
        return len(self.rows(run_id=run_id, step_id=step_id))

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None and filelocks.may_close(db):  # not one opened before fork(), in the child
            with contextlib.suppress(sqlite3.Error):
                if not self.read_only and self._file is not None and filelocks.name_moved(self._real, self._file.key):
                    # SQLite does not checkpoint a moved file on close: its effects would stay in the WAL
                    # beside the old name, unseen under the new one (see _refuse_if_renamed).
                    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                if self._wal is not None and self._file is not None and self._wal.foreign():
                    filelocks.pin_no_checkpoint(self._file)  # see SqliteJournal.close
                db.close()
        shared, self._file = self._file, None
        if shared is not None:
            filelocks.release(shared)  # after the connection: its descriptor's close drops SQLite's locks


class _LedgerBacked:
    """An adapter over the effect store; ``lookup`` inspects the ledger for reconciliation."""

    blocking = True
    keeps_descriptors = True  # closes none it did not open (effectlog.toolguard)

    def __init__(self, store: EffectStore) -> None:
        self.store = store

    def lookup(self, request: Request) -> Evidence:
        return self.store.lookup(request)


class IdempotentEffects(_LedgerBacked):
    """``effects.idempotent``: one effect per idempotency key; repeats return the stored receipt."""

    def invoke(self, request: Request) -> Receipt:
        return self.store.apply_idempotent(request)


class ControlEffects(_LedgerBacked):
    """``effects.control``: an effect on every call (the tool without an idempotency contract)."""

    def invoke(self, request: Request) -> Receipt:
        return self.store.apply_control(request)
