"""The PostgreSQL journal: the same guarantees as the SQLite one, for many hosts.

Append-only is enforced by the database (a statement trigger refuses UPDATE,
DELETE and TRUNCATE, and fires even with ``session_replication_role = replica``),
deduplication is a constraint (primary key ``(run_id, seq)``, unique
``(run_id, step_id, phase, attempt)``), and a batch is one transaction.

Writers. Unlike the SQLite file there is no writer lock on the whole journal: many
processes on many hosts append to one database. A run should still have one writer
at a time (the fleet's lease and fencing token decide which), but the journal does
not trust that: every append takes a transaction-scoped advisory lock per run
(``pg_advisory_xact_lock(RUN_LOCK_CLASS, hashtext(run_id))``, in sorted run order
so two batches cannot deadlock), and only then reads the run's head. A second
writer that raced for the same seq therefore sees the first one's committed event
and gets ``EventConflict`` (other bytes) or a no-op (same bytes), or
``SequenceGap``; the primary key stops any writer that skips the lock. The chain
cannot fork. A plain append never trusts a cached head, since another host may have
moved it. A fenced append (``append_under``) may chain onto the head this journal last
committed, in one statement with its fence's check (``_fenced_in_one``): that head is
a lower bound with the right hash (events are never changed), and when it is stale the
first row hits the primary key, the transaction rolls back whole, and the append is
redone with the head read under the lock.

Owners. A run's owner (``effectlog.journal.ownership``) holds a *session* advisory lock
``(OWNER_LOCK_CLASS, hashtext(run_id))`` on a connection of its own, which the server
releases when that connection ends (a killed process, a lost host). The owner row's
token is bumped by every claim and checked inside every owner's append, so an owner
whose connection was lost while another took the run over is refused, never merged.
Anyone else's append takes the same lock for its transaction (``pg_try_advisory_xact_lock``)
and is refused while a live owner holds it.

A writer stopped inside a transaction (SIGSTOP, a hung host) would hold its run
locks forever; ``idle_in_transaction_session_timeout`` makes the server end such a
session, and ``lock_timeout`` turns a long wait for a run into ``JournalLocked``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from effectlog.chain import GENESIS, Chain
from effectlog.errors import (
    BadInput,
    EventConflict,
    JournalInherited,
    JournalUnreadable,
    RunOwned,
    SequenceGap,
    StorageError,
)
from effectlog.events import Event, encode
from effectlog.fold import Record, Row
from effectlog.journal import checkpoint
from effectlog.journal.bindings import check_binding, lease_holder
from effectlog.journal.keycheck import FINGERPRINT_KEY, LastLink, check_key
from effectlog.journal.ownership import (
    PASSING_WAIT_S,
    Claim,
    Fence,
    Owner,
    OwnerStatus,
    decode_owner,
    describe,
    encode_owner,
    may_still_act,
    new_owner,
)
from effectlog.journal.postgres_schema import (
    ADD_ALIVE_UNTIL,
    ADD_LEASE_S,
    ADD_RENEWED_ON,
    END_OWNER,
    HAS_ALIVE_UNTIL,
    HAS_LEASE_S,
    HAS_RENEWED_ON,
    HEAD,
    INSERT,
    INSERT_FINGERPRINT,
    LAST_LINK,
    LOCK_RUN,
    META_KEYS,
    MIGRATE_LOCK_CLASS,
    MIGRATIONS,
    OWNER_LOCK_CLASS,
    OWNER_RENEWED,
    OWNER_ROW,
    OWNERS_DDL,
    READ,
    RENEW_OWNERS,
    RUN_LOCK_CLASS,
    SCHEMA,
    UPSERT_OWNER,
    configure_session,
    keep_when_idle,
    pin_search_path,
    translate,
)
from effectlog.journal.protocol import SCHEMA_VERSION
from effectlog.journal.sidecars import masked

# How long a claim stays live on the owner row after its process last renewed it (a third of this apart),
# once its session lock is gone: the wait for another host to take over the run of a host that died.
OWNER_LEASE_S = 15.0
# The pause between a renewal turn's tries (each failed one drops a broken pooled connection).
_RENEW_PAUSE_S = 0.02
_MORE_ROWS = ", (%s, %s, %s, %s, %s, %s, %s)"  # INSERT's VALUES list, one more row
_CHUNK = 1000  # rows per INSERT statement
_SEEN_MAX = 10_000  # runs whose last seen head a journal keeps (``_fenced_in_one``)
_TYPED_ROW = "(%s::text, %s::bigint, %s::text, %s::text, %s::integer, %s::bytea, %s::bytea)"


@functools.cache
def _insert_select(rows: int) -> str:
    """``INSERT ... SELECT v.* FROM (VALUES ...) v``: the rows as a query a fence can join its check to."""
    return (
        f"INSERT INTO {SCHEMA}.events (run_id, seq, step_id, phase, attempt, body, hash) SELECT v.* FROM (VALUES "
        + ", ".join([_TYPED_ROW] * rows)
        + ") AS v (run_id, seq, step_id, phase, attempt, body, hash)"
    )


@runtime_checkable
class InsertingFence(Fence, Protocol):
    """A fence whose check can also insert the batch's rows, in the same statement (``LeaseFence``)."""

    @property
    def inserts(self) -> bool: ...

    def admit_inserting(
        self, conn: Any, events: Sequence[Event], encoded: Sequence[bytes], insert: tuple[str, Sequence[Any]] | None
    ) -> bool: ...


class PostgresJournal:
    """A journal in one PostgreSQL database (schema ``effectlog``).

    ``writer=False`` opens every session read-only and never migrates. Connections
    come from a small pool, so one journal object may be shared by threads (a
    runner's step loop and its heartbeat).
    """

    def __init__(
        self,
        url: str,
        *,
        writer: bool = True,
        chain: Chain | None = None,
        lock_timeout_s: float = 10.0,
        idle_in_transaction_timeout_s: float = 60.0,
        pool_size: int = 4,
        owner_lease_s: float = OWNER_LEASE_S,
    ) -> None:
        checkpoint.check_setting()
        self.location = masked(url)
        if not (math.isfinite(owner_lease_s) and owner_lease_s > 0):
            # Renewed every third of it: 0 or less renews without pause; infinity holds a dead host's run for ever.
            raise BadInput(
                f"{self.location}: owner_lease_s must be a finite number of seconds above 0, not {owner_lease_s!r}"
            )
        self.chain = chain or Chain()
        # Test hook: called inside the transaction, after the rows are written, before COMMIT.
        self.before_commit: Callable[[Sequence[Event]], None] | None = None
        self.writer = writer
        self._url = url
        self._claims: dict[str, Claim] = {}
        self._seen: dict[str, tuple[int, bytes]] = {}  # run -> last head this journal committed (fenced appends)
        self._owner_conn: psycopg.Connection[Any] | None = None  # holds the claims' session locks
        self._pid = os.getpid()  # a child of fork() shares these server sessions: see _refuse_inherited
        self._owner_lease_s = owner_lease_s
        self._renewer: threading.Thread | None = None  # renews this process's claims (``_renew``)
        self._renewing = threading.Event()  # set: the renewer stops
        # Held by a renewal from choosing its claims to writing them, and by a release from dropping its claim
        # to ending its row: a renewal that chose a claim before its release then writes after END_OWNER.
        self._renewal = threading.Lock()
        self._settings = {
            "lock_timeout": f"{int(lock_timeout_s * 1000)}ms",
            "idle_in_transaction_session_timeout": f"{int(idle_in_transaction_timeout_s * 1000)}ms",
        }
        if not writer:
            self._settings["default_transaction_read_only"] = "on"
        try:
            params = conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            raise BadInput(f"{self.location}: not a usable PostgreSQL URL ({exc})") from None
        self._kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in params:
            self._kwargs["connect_timeout"] = 10
        if "application_name" not in params:
            self._kwargs["application_name"] = "effectlog-journal"
        # Migrate on one direct connection first: a refused or failed connect then
        # surfaces with the server's own reason, which a pool would only log.
        try:
            with psycopg.connect(url, **self._kwargs) as conn:
                self._configure(conn)
                self._migrate(conn)
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, self.location) from None
        self._pool: ConnectionPool[psycopg.Connection[tuple[Any, ...]]] = ConnectionPool(
            url,
            kwargs=self._kwargs,
            min_size=1,
            max_size=max(1, pool_size),
            configure=self._configure,
            open=False,
            name="effectlog-journal",
        )
        try:
            self._pool.open(wait=True, timeout=float(self._kwargs.get("connect_timeout", 10)) + 5)
        except PoolTimeout as exc:
            self._pool.close()
            raise translate(exc, self.location) from None

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        configure_session(conn, self._settings)

    # -- schema -------------------------------------------------------------------

    def _version(self, conn: psycopg.Connection[Any]) -> int:
        # pg_tables, not to_regclass(): a query sees the snapshot taken after the migration
        # lock, while to_regclass() may answer from a catalog cache older than that lock.
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = %s AND tablename IN ('meta', 'events')",
                (SCHEMA,),
            )
        }
        has_meta, has_events = "meta" in tables, "events" in tables
        if not has_meta and not has_events:
            return 0
        if not (has_meta and has_events):
            raise JournalUnreadable(f"{self.location}: not an effectlog journal (unexpected tables)")
        found = conn.execute(f"SELECT value FROM {SCHEMA}.meta WHERE key = 'schema_version'").fetchone()
        if found is None or not (str(found[0]).isascii() and str(found[0]).isdigit()):  # not ²
            raise JournalUnreadable(f"{self.location}: not an effectlog journal (no schema version)")
        return int(found[0])

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        self._migrate_events(conn)
        if self.writer and not self._has_owners(conn):
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (MIGRATE_LOCK_CLASS,))
                for sql in OWNERS_DDL:
                    conn.execute(sql)
        if self.writer and conn.execute(HAS_ALIVE_UNTIL, (f"{SCHEMA}.owners",)).fetchone() is None:
            with conn.transaction():  # an owners table of an earlier version: its rows are never renewed
                conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (MIGRATE_LOCK_CLASS,))
                conn.execute(ADD_ALIVE_UNTIL)
        if self.writer and conn.execute(HAS_RENEWED_ON, (f"{SCHEMA}.owners",)).fetchone() is None:
            with conn.transaction():  # which start of the server took a claim's last renewal (OWNER_RENEWED)
                conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (MIGRATE_LOCK_CLASS,))
                conn.execute(ADD_RENEWED_ON)
        if self.writer and conn.execute(HAS_LEASE_S, (f"{SCHEMA}.owners",)).fetchone() is None:
            with conn.transaction():  # the owner's lease, the least grace after a restart (OWNER_RENEWED)
                conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (MIGRATE_LOCK_CLASS,))
                conn.execute(ADD_LEASE_S)
        if self.writer:
            self._add_checkpoints(conn)

    def _add_checkpoints(self, conn: psycopg.Connection[Any]) -> None:
        """The checkpoints table (``journal.checkpoint``), added to older journals by their first writer."""
        if self._has_table(conn, "checkpoints"):
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (MIGRATE_LOCK_CLASS,))
            if not self._has_table(conn, "checkpoints"):
                for sql in checkpoint.postgres_ddl(SCHEMA):
                    conn.execute(sql)

    @staticmethod
    def _has_table(conn: psycopg.Connection[Any], name: str) -> bool:
        found = conn.execute(
            "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = %s AND tablename = %s", (SCHEMA, name)
        ).fetchone()
        return found is not None

    @staticmethod
    def _has_owners(conn: psycopg.Connection[Any]) -> bool:
        found = conn.execute(
            "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = %s AND tablename = 'owners'", (SCHEMA,)
        ).fetchone()
        return found is not None

    def _migrate_events(self, conn: psycopg.Connection[Any]) -> None:
        version = self._version(conn)
        if version == SCHEMA_VERSION:
            self._check_chain(conn)
            return
        self._refuse_version(version)
        with conn.transaction():
            # Several writers may open a fresh database at once: one migrates, the
            # others wait here and then find the work done.
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (MIGRATE_LOCK_CLASS,))
            version = self._version(conn)
            self._refuse_version(version)
            for statements in MIGRATIONS[version:]:
                for sql in statements:
                    conn.execute(sql)  # module constants, never input
            conn.execute(
                f"INSERT INTO {SCHEMA}.meta (key, value) VALUES ('schema_version', %s)"
                " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                (str(SCHEMA_VERSION),),
            )
            conn.execute(
                f"INSERT INTO {SCHEMA}.meta (key, value) VALUES ('chain', %s) ON CONFLICT (key) DO NOTHING",
                (self.chain.name,),
            )
            if version == 0 and self.chain.key is not None:  # a new keyed journal records its key
                conn.execute(INSERT_FINGERPRINT, (self.chain.fingerprint(),))
        self._check_chain(conn)

    def _refuse_version(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise JournalUnreadable(
                f"{self.location}: journal schema v{version} is newer than this effectlog "
                f"(v{SCHEMA_VERSION}); upgrade effectlog to read it"
            )
        if version < SCHEMA_VERSION and not self.writer:
            what = "no effectlog journal in this database" if version == 0 else f"journal schema v{version}"
            raise JournalUnreadable(f"{self.location}: {what}; it needs a writer to create or migrate it")

    def _check_chain(self, conn: psycopg.Connection[Any]) -> None:
        """Refuse another chain kind or another key (``keycheck``); a writer records the key's fingerprint
        in a keyed journal from before it, once its last event's link checked the key."""
        if self._key_to_record(conn) and self.writer:
            with conn.transaction():  # checked again under the lock: two writers with two keys cannot both pass
                conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (MIGRATE_LOCK_CLASS,))
                if self._key_to_record(conn):
                    conn.execute(INSERT_FINGERPRINT, (self.chain.fingerprint(),))

    def _key_to_record(self, conn: psycopg.Connection[Any]) -> bool:
        stored = {str(k): str(v) for k, v in conn.execute(META_KEYS).fetchall()}
        fingerprint = stored.get(FINGERPRINT_KEY)
        last = None
        if self.chain.key is not None and fingerprint != self.chain.fingerprint():  # else no read
            row = conn.execute(LAST_LINK).fetchone()
            if row is not None:
                prev = None if row[2] is None else bytes(row[2])
                last = LastLink(str(row[0]), int(row[1]), prev, bytes(row[3]), bytes(row[4]))
        return check_key(self.location, self.chain, stored.get("chain"), fingerprint, last)

    # -- the Protocol -------------------------------------------------------------

    def head(self, run_id: str) -> tuple[int, bytes]:
        try:
            with self._connection() as conn:
                return self._head(conn, run_id)
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, self.location) from None

    @staticmethod
    def _head(conn: psycopg.Connection[Any], run_id: str) -> tuple[int, bytes]:
        row = conn.execute(HEAD, (run_id,)).fetchone()
        return (int(row[0]), bytes(row[1])) if row else (0, GENESIS)

    # -- ownership ----------------------------------------------------------------

    def claim(self, run_id: str, kind: str = "run", *, runner: str | None = None) -> Claim:
        """Take ``run_id`` until ``release``; ``RunOwned`` (exit 6) if a live owner (any host) has it."""
        if not self.writer:
            raise StorageError(f"{self.location}: journal opened read-only")
        self._refuse_inherited()
        if run_id in self._claims:
            raise RunOwned("the run is driven by another actor in this process; nothing was written", run_id=run_id)
        claim = Claim(run_id=run_id, owner=new_owner(kind, runner))
        try:
            conn = self._owner_connection()
            deadline = time.monotonic() + PASSING_WAIT_S
            while True:
                got = conn.execute(
                    "SELECT pg_try_advisory_lock(%s, hashtext(%s))", (OWNER_LOCK_CLASS, run_id)
                ).fetchone()
                if (got and got[0]) or time.monotonic() > deadline or self.owner(run_id).live:
                    break
                time.sleep(0.005)  # one-shot writers (shared) passing through: wait for them, briefly
            if not (got and got[0]):
                raise RunOwned(
                    f"the run is driven by {describe(self.owner(run_id).owner)}; nothing was written", run_id=run_id
                )
            try:
                with self._connection() as pooled, pooled.transaction():
                    pooled.execute(LOCK_RUN, (RUN_LOCK_CLASS, run_id))  # no append of the run is in flight
                    self._refuse_renewed(pooled, run_id)
                    self._check_binding(pooled, run_id, kind)
                    row = pooled.execute(
                        UPSERT_OWNER, (run_id, encode_owner(claim.owner), self._owner_lease_s, self._owner_lease_s)
                    ).fetchone()
                    assert row is not None
                    claim.token = int(row[0])
            except BaseException:
                conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (OWNER_LOCK_CLASS, run_id))
                raise
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, self.location) from None
        self._claims[run_id] = claim
        self._start_renewer()
        return claim

    def _refuse_renewed(self, conn: psycopg.Connection[Any], run_id: str) -> None:
        """``RunOwned`` if the run's last owner still renews its claim and its process may still be running.

        Its session lock is gone (this process could take it), but that lock ends with the connection,
        not with the process: a server that ended the session (a failover, an idle-session timeout, a
        firewall that dropped the idle socket during a long tool call) left the owner running, maybe
        inside a tool call whose effect has not landed yet. Taken over then, the run's step was asked
        of the tool's lookup ("not applied": the call was still in flight) and sent again: two effects.
        """
        row = conn.execute(OWNER_RENEWED, (run_id,)).fetchone()
        if row is None or not row[2]:
            return
        owner = decode_owner(row[1])
        if owner is not None and not may_still_act(owner):
            return  # a process of this host that is gone (killed): its claim ended with it
        raise RunOwned(
            f"the run is driven by {describe(owner)}, whose connection to the journal ended while its process "
            f"kept renewing its claim (every {self._owner_lease_s / 3:g}s); nothing was written: run it again once "
            f"that process has ended or stopped renewing ({self._owner_lease_s:g}s after)",
            run_id=run_id,
        )

    def _start_renewer(self) -> None:
        if self._renewer is None:
            # A weak reference: a journal its user forgot to close is still collected (and its pool closed).
            target = functools.partial(_renew, weakref.ref(self), self._renewing, self._owner_lease_s)
            self._renewer = threading.Thread(target=target, name="effectlog-owner-renewal", daemon=True)
            self._renewer.start()

    def _renew_claims(self, timeout_s: float) -> None:
        with self._renewal:
            held = [(c.run_id, c.token) for c in list(self._claims.values()) if c.token]
            if held:
                lease = self._owner_lease_s
                params = (lease, lease, [r for r, _ in held], [t for _, t in held])
                self._on_pooled(RENEW_OWNERS, params, timeout_s)

    def _on_pooled(self, sql: str, params: Sequence[Any], timeout_s: float) -> None:
        """One statement of the owner rows (a renewal, a release's clearing), tried on pooled connections until
        one takes it or ``timeout_s`` is spent; a failure is dropped (the next renewal tries again).

        A failover, a server restart or a sweep of idle sessions ends every session of this process at
        once, the pooled ones too, and the pool only finds a connection broken once it is used (then drops
        it): a renewal tried once per turn failed on each of them in turn, and with a few idle in the pool
        the claim ran out while its owner was inside a call (another process took the run over); a release
        tried once left the released run refused for a lease. Each failed try drops one broken connection,
        so the next comes from those left or is a new one."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with self._pool.connection(timeout=max(deadline - time.monotonic(), 0.001)) as conn:
                    conn.execute(sql, params)
                return
            except PoolTimeout:
                return  # no connection to be had now
            except psycopg.Error:
                if time.monotonic() >= deadline:
                    return
                time.sleep(_RENEW_PAUSE_S)  # a server that refuses every session is not hammered

    def release(self, claim: Claim) -> None:
        if claim.released or self._claims.get(claim.run_id) is not claim:
            return
        claim.released = True
        if os.getpid() != self._pid:
            del self._claims[claim.run_id]
            return  # in a child of fork(): the session and its lock are the parent's
        with self._renewal:  # a renewal in flight writes before END_OWNER, a later one no longer has the claim
            del self._claims[claim.run_id]
            if claim.token:  # no longer renewed, before the lock is let go: the next claim need not wait for it
                self._on_pooled(END_OWNER, (claim.run_id, claim.token), self._owner_lease_s / 3)
        conn = self._owner_conn
        if conn is None:
            return  # its connection ended (another release found it gone), and with it the lock
        try:
            conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (OWNER_LOCK_CLASS, claim.run_id))
        except psycopg.Error:
            # The connection is gone, and with it the lock: the server released it already.
            with contextlib.suppress(psycopg.Error):
                conn.close()
            self._owner_conn = None

    def owner(self, run_id: str, *, leases: bool = True) -> OwnerStatus:
        """As ``SqliteJournal.owner``."""
        try:
            with self._connection() as conn:
                runner = self._lease_holder(conn, run_id) if leases else None
                if runner is not None:
                    return OwnerStatus(owner=runner[0], live=True, waiting=runner[1])
                row = conn.execute(OWNER_RENEWED, (run_id,)).fetchone() if self._has_owners(conn) else None
                if run_id in self._claims:
                    live = True
                else:
                    # Shared: one-shot writers (shared too) passing through are no owner.
                    got = conn.execute(
                        "SELECT pg_try_advisory_lock_shared(%s, hashtext(%s))", (OWNER_LOCK_CLASS, run_id)
                    ).fetchone()
                    live = not (got and got[0])
                    if not live:
                        conn.execute("SELECT pg_advisory_unlock_shared(%s, hashtext(%s))", (OWNER_LOCK_CLASS, run_id))
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, self.location) from None
        owner = decode_owner(row[1]) if row else None
        if not live and row is not None and row[2]:  # still renewed: see _refuse_renewed
            live = owner is None or may_still_act(owner)
        return OwnerStatus(owner=owner, live=live)

    def _owner_connection(self) -> psycopg.Connection[Any]:
        conn = self._owner_conn
        if conn is None or conn.closed or conn.broken:
            if not self._claims:
                conn = None
            else:
                # The connection that held our claims is gone, so are its locks: another may own them now.
                lost = ", ".join(sorted(self._claims))
                raise RunOwned(f"the connection holding this process's claims was lost (runs {lost})")
        if conn is None:
            conn = psycopg.connect(self._url, **{**self._kwargs, "application_name": "effectlog-owner"})
            pin_search_path(conn)
            keep_when_idle(conn)
            self._owner_conn = conn
        return conn

    @staticmethod
    def _lease_holder(conn: psycopg.Connection[Any], run_id: str) -> tuple[Owner, bool] | None:
        fleet = conn.execute("SELECT to_regclass('effectlog_fleet.requests') IS NOT NULL").fetchone()
        if not (fleet and fleet[0]):
            return None
        now = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert now is not None
        return lease_holder(
            lambda sql, params: [tuple(r) for r in conn.execute(sql, params).fetchall()],
            requests="effectlog_fleet.requests",
            attempts="effectlog_fleet.attempts",
            placeholder="%s",
            run_id=run_id,
            now=float(now[0]),
        )

    def _check_binding(self, conn: psycopg.Connection[Any], run_id: str, kind: str) -> None:
        fleet = conn.execute("SELECT to_regclass('effectlog_fleet.requests') IS NOT NULL").fetchone()
        if not (fleet and fleet[0]):
            return
        now = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert now is not None
        check_binding(
            lambda sql, params: [tuple(r) for r in conn.execute(sql, params).fetchall()],
            requests="effectlog_fleet.requests",
            attempts="effectlog_fleet.attempts",
            placeholder="%s",
            run_id=run_id,
            kind=kind,
            now=float(now[0]),
        )

    def _check_owners(self, conn: psycopg.Connection[Any], events: Sequence[Event]) -> None:
        """Inside the append's transaction, after the run locks: every run's writer may write it."""
        for run_id in sorted({e.run_id for e in events}):
            claim = self._claims.get(run_id)
            if claim is None:
                # Shared: writers passing through never refuse each other, only an owner refuses them.
                got = conn.execute(
                    "SELECT pg_try_advisory_xact_lock_shared(%s, hashtext(%s))", (OWNER_LOCK_CLASS, run_id)
                ).fetchone()
                if not (got and got[0]):
                    row = conn.execute(OWNER_ROW, (run_id,)).fetchone()
                    who = describe(decode_owner(row[1]) if row else None)
                    raise RunOwned(f"the run is driven by {who}; nothing was written", run_id=run_id)
                self._refuse_renewed(conn, run_id)
                self._check_binding(conn, run_id, "operator")
                continue
            row = conn.execute(OWNER_ROW, (run_id,)).fetchone()
            if row is None or int(row[0]) != claim.token:
                who = describe(decode_owner(row[1]) if row else None)
                raise RunOwned(
                    f"this process lost the run to {who} (its claim's connection ended); nothing was written",
                    run_id=run_id,
                )

    # -- appends ------------------------------------------------------------------

    @checkpoint.forwards
    def append(self, events: Sequence[Event]) -> list[Record]:
        return self.append_checkpointed(events, (), ())

    def append_checkpointed(
        self,
        events: Sequence[Event],
        seals: Sequence[tuple[str, int, bytes]],
        checkpoints: Sequence[checkpoint.CheckpointRow],
    ) -> list[Record]:
        """``append`` plus checkpoint segments of the runs it advances, in the same transaction."""
        if seals:
            raise StorageError(f"{self.location}: this journal keeps no seals (closed runs are replayed)")
        if not self.writer:
            raise StorageError(f"{self.location}: journal opened read-only")
        self._refuse_inherited()
        if not events:
            return []
        try:
            with self._connection() as conn:
                try:
                    with conn.transaction():
                        self._lock_runs(conn, events)
                        self._check_owners(conn, events)
                        records = self._append_locked(conn, events)
                        if checkpoints:
                            self._insert_checkpoints(conn, records, checkpoints)
                        return records
                except pg_errors.UniqueViolation as exc:
                    # The transaction is rolled back; explain the conflict from committed rows.
                    raise self._unique_conflict(conn, events, exc) from None
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, self.location) from None

    def _insert_checkpoints(
        self, conn: psycopg.Connection[Any], records: Sequence[Record], rows: Sequence[checkpoint.CheckpointRow]
    ) -> None:
        """Each segment after its run's last event of this batch (the head, under the run's lock)."""
        last = {r.run_id: (r.seq, r.hash) for r in records}
        for row in rows:
            head = last.get(row[0]) or self._head(conn, row[0])
            if row[1] != head[0]:
                raise SequenceGap(
                    f"a checkpoint must follow the run's last event (seq {head[0]}), not seq {row[1]}",
                    run_id=row[0],
                    seq=row[1],
                )
            checkpoint.insert(
                functools.partial(_rows, conn),
                f"{SCHEMA}.checkpoints",
                "%s",
                chain=self.chain,
                row=row,
                event_hash=head[1],
            )

    def checkpoint_rows(self, run_id: str) -> list[tuple[int, bytes, bytes, bytes, bytes | None]]:
        """The run's checkpoint segments with their events' hashes, for ``checkpoint.load``; unchecked."""
        sql = checkpoint.select_sql(f"{SCHEMA}.checkpoints", f"{SCHEMA}.events", "%s")
        return [
            (int(r[0]), bytes(r[1]), bytes(r[2]), bytes(r[3]), None if r[4] is None else bytes(r[4]))
            for r in self._checkpoint_query(sql, run_id)
        ]

    def last_checkpoint_row(self, run_id: str) -> list[tuple[int, bytes, bytes, bytes, bytes | None]]:
        """The run's last checkpoint segment (``checkpoint_rows``' last row, or none), for a resume; unchecked."""
        sql = checkpoint.select_sql(f"{SCHEMA}.checkpoints", f"{SCHEMA}.events", "%s", last=True)
        return [
            (int(r[0]), bytes(r[1]), bytes(r[2]), bytes(r[3]), None if r[4] is None else bytes(r[4]))
            for r in self._checkpoint_query(sql, run_id)
        ]

    def stored_checkpoints(self, run_id: str) -> list[checkpoint.StoredSegment]:
        """The run's checkpoint rows as stored, ``(run id, seq, prev, body, hash)``; unchecked."""
        sql = f"SELECT run_id, seq, prev, body, hash FROM {SCHEMA}.checkpoints WHERE run_id = %s ORDER BY seq"
        return [
            (str(r[0]), int(r[1]), bytes(r[2]), bytes(r[3]), bytes(r[4])) for r in self._checkpoint_query(sql, run_id)
        ]

    def checkpointed_runs(self) -> list[tuple[str, int]]:
        """Each run that has segments, with its last segment's seq; unchecked."""
        sql = f"SELECT run_id, max(seq) FROM {SCHEMA}.checkpoints GROUP BY run_id ORDER BY run_id"
        return [(str(r[0]), int(r[1])) for r in self._checkpoint_query(sql, None)]

    def _checkpoint_query(self, sql: str, run_id: str | None) -> list[tuple[Any, ...]]:
        try:
            with self._connection() as conn:
                if not self._has_table(conn, "checkpoints"):  # a journal no writer has opened since they exist
                    return []
                return list(conn.execute(sql, (run_id,) if run_id is not None else ()).fetchall())
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, self.location) from None

    def append_under(self, events: Sequence[Event], fence: Fence) -> list[Record]:
        """Append under another proof of ownership (a fleet lease), checked in the same transaction.

        A fence that can take the rows into its own check (``InsertingFence``) gets them when
        the batch follows the head this journal last saw for the run (``_fenced_in_one``):
        BEGIN, the run's lock, ONE statement (check, record, insert), COMMIT. Otherwise, or
        when that head turns out stale, the head is read under the lock as for any append.
        """
        if not self.writer:
            raise StorageError(f"{self.location}: journal opened read-only")
        self._refuse_inherited()
        if not events:
            return []
        encoded = [encode(e) for e in events]
        try:
            with self._connection() as conn:
                if isinstance(fence, InsertingFence) and fence.inserts:
                    done = self._fenced_in_one(conn, events, encoded, fence)
                    if done is not None:
                        return done
                try:
                    with conn.transaction():
                        self._lock_runs(conn, events)
                        if not fence.admit(conn, events, encoded):
                            records = [self._same(conn, e, b) for e, b in zip(events, encoded, strict=True)]
                        else:
                            records = self._append_locked(conn, events)
                            fence.written(conn, events, encoded)
                except pg_errors.UniqueViolation as exc:
                    raise self._unique_conflict(conn, events, exc) from None
                self._saw(records)
                return records
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, self.location) from None

    def _fenced_in_one(
        self, conn: psycopg.Connection[Any], events: Sequence[Event], encoded: Sequence[bytes], fence: InsertingFence
    ) -> list[Record] | None:
        """The batch inserted by the fence's own check, chained onto the run's last seen head; None: go the long way.

        The last seen head is (0, genesis) for a run this journal never wrote, else the last
        event this journal committed or read back under the run's lock. Events are never
        updated or deleted, so that head is a lower bound of the real one with the right hash.
        If the real head moved on (another writer, another process), the insert's first row
        collides with the primary key ``(run_id, seq)``: the statement fails, the transaction
        is rolled back whole (lease check and operation record included), and the caller
        reads the head under the lock as for any append. The chain cannot fork.
        """
        run_id = events[0].run_id
        last_seq, last_hash = self._seen.get(run_id, (0, GENESIS))
        if len(events) > _CHUNK or any(e.run_id != run_id or e.seq != last_seq + 1 + i for i, e in enumerate(events)):
            return None  # a resumed run's first append, a retried batch, a gap: the head read decides
        records: list[Record] = []
        params: list[Any] = []
        for event, body in zip(events, encoded, strict=True):
            last_hash = self.chain.link(last_hash, body)
            records.append(Record(run_id, event.seq, body, last_hash))
            params += (run_id, event.seq, event.step_key, event.phase, event.attempt_no, body, last_hash)
        try:
            with conn.transaction():
                self._lock_runs(conn, events)  # its own statement: the next one's snapshot is taken after it
                if not fence.admit_inserting(conn, events, encoded, (_insert_select(len(events)), params)):
                    records = [self._same(conn, e, b) for e, b in zip(events, encoded, strict=True)]
                else:
                    if self.before_commit is not None:
                        self.before_commit(events)
                    fence.written(conn, events, encoded)
        except pg_errors.UniqueViolation:
            self._seen.pop(run_id, None)  # stale (or a dedup conflict): the long way says which
            return None
        self._saw(records)
        return records

    def _saw(self, records: Sequence[Record]) -> None:
        """Remember each run's last committed record (a lower bound of its head, for ``_fenced_in_one``)."""
        if len(self._seen) > _SEEN_MAX:
            self._seen.clear()  # a long-lived runner: forgetting only costs a head read
        for record in records:
            if record.seq > self._seen.get(record.run_id, (0, b""))[0]:
                self._seen[record.run_id] = (record.seq, record.hash)

    def _same(self, conn: psycopg.Connection[Any], event: Event, body: bytes) -> Record:
        known = self._stored(conn, event.run_id, event.seq)
        if known is None or known.body != body:
            raise EventConflict("a different event is already recorded at this seq", run_id=event.run_id, seq=event.seq)
        return known

    @staticmethod
    def _lock_runs(conn: psycopg.Connection[Any], events: Sequence[Event]) -> None:
        """The runs' transaction locks, in sorted order (two batches cannot deadlock); re-taking one is free."""
        for run_id in sorted({e.run_id for e in events}):
            conn.execute(LOCK_RUN, (RUN_LOCK_CLASS, run_id))

    def _append_locked(self, conn: psycopg.Connection[Any], events: Sequence[Event]) -> list[Record]:
        # The caller took the runs' locks (``_lock_runs``) in an earlier statement of this
        # transaction, on purpose: under READ COMMITTED each statement takes its snapshot
        # when it starts, so only a head query issued after the lock is granted sees the
        # previous holder's commit.
        heads: dict[str, tuple[int, bytes]] = {}
        pending: dict[tuple[str, int], Record] = {}
        stored: dict[tuple[str, int], Record] = {}
        rows: list[tuple[str, int, str, str, int, bytes, bytes]] = []
        out: list[Record] = []
        for event in events:
            run_id = event.run_id
            if run_id not in heads:
                heads[run_id] = self._head(conn, run_id)
            last_seq, last_hash = heads[run_id]
            body = encode(event)
            if event.seq <= last_seq:
                key = (run_id, event.seq)
                known = pending.get(key) or stored.get(key) or self._stored(conn, run_id, event.seq)
                if known is None or known.body != body:
                    raise EventConflict(
                        "a different event is already recorded at this seq", run_id=run_id, seq=event.seq
                    )
                stored[key] = known
                out.append(known)
                continue
            if event.seq != last_seq + 1:
                raise SequenceGap(f"append expected seq {last_seq + 1}, got {event.seq}", run_id=run_id, seq=event.seq)
            digest = self.chain.link(last_hash, body)
            record = Record(run_id, event.seq, body, digest)
            rows.append((run_id, event.seq, event.step_key, event.phase, event.attempt_no, body, digest))
            pending[(run_id, event.seq)] = record
            heads[run_id] = (event.seq, digest)
            out.append(record)
        # One statement per chunk of rows (a pipelined executemany is a statement per row);
        # chunks keep a statement well under the protocol's 65,535 parameters.
        for start in range(0, len(rows), _CHUNK):
            chunk = rows[start : start + _CHUNK]
            conn.execute(INSERT + _MORE_ROWS * (len(chunk) - 1), [value for row in chunk for value in row])
        if self.before_commit is not None:
            self.before_commit(events)
        return out

    @staticmethod
    def _stored(conn: psycopg.Connection[Any], run_id: str, seq: int) -> Record | None:
        row = conn.execute(
            f"SELECT body, hash FROM {SCHEMA}.events WHERE run_id = %s AND seq = %s", (run_id, seq)
        ).fetchone()
        return Record(run_id, seq, bytes(row[0]), bytes(row[1])) if row else None

    def _unique_conflict(
        self, conn: psycopg.Connection[Any], events: Sequence[Event], exc: pg_errors.UniqueViolation
    ) -> EventConflict:
        if exc.diag.constraint_name != "events_dedup":
            # The run lock makes this unreachable for effectlog writers; a writer that
            # skipped it lost the race for a seq.
            return EventConflict(
                f"another writer recorded the same seq concurrently ({exc.diag.message_detail or exc})",
                run_id=events[0].run_id,
            )
        seen: dict[tuple[str, str, str, int], int] = {}
        for event in events:
            identity = (event.run_id, event.step_key, event.phase, event.attempt_no)
            row = conn.execute(
                f"SELECT seq FROM {SCHEMA}.events WHERE run_id = %s AND step_id = %s AND phase = %s AND attempt = %s",
                identity,
            ).fetchone()
            at = row[0] if row and row[0] != event.seq else seen.get(identity)
            if at is not None:
                return EventConflict(
                    f"{event.phase} for attempt {event.attempt_no} is already recorded at seq {at}",
                    run_id=event.run_id,
                    seq=event.seq,
                    step_id=event.step_key or None,
                )
            seen.setdefault(identity, event.seq)
        return EventConflict("a step's phase and attempt are already recorded", run_id=events[0].run_id)

    def read(self, run_id: str, after_seq: int = 0) -> Iterator[Record]:
        for row in self.read_rows(run_id, after_seq):
            yield Record(run_id, *row)

    def read_rows(self, run_id: str, after_seq: int = 0) -> Iterator[Row]:
        """``read``'s rows as ``fold.fold_rows`` takes them, without a ``Record`` per row (as SQLite's)."""
        try:
            with self._connection() as conn:
                rows = conn.execute(READ, (run_id, after_seq)).fetchall()
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, self.location) from None
        for seq, body, digest, step_id, phase, attempt in rows:
            yield int(seq), bytes(body), bytes(digest), step_id, phase, attempt

    def first_body(self, run_id: str) -> bytes | None:
        """The body of the run's first event, one row read (``verify``'s look at the request a run serves:
        ``read`` would fetch the whole run again)."""
        try:
            with self._connection() as conn:
                row = conn.execute(
                    f"SELECT body FROM {SCHEMA}.events WHERE run_id = %s AND seq = 1", (run_id,)
                ).fetchone()
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, self.location) from None
        return bytes(row[0]) if row is not None else None

    def runs(self) -> list[str]:
        try:
            with self._connection() as conn:
                # COLLATE "C": code-point order, the same as Python's sorted(), whatever the database locale.
                rows = conn.execute(
                    f'SELECT DISTINCT run_id COLLATE "C" AS r FROM {SCHEMA}.events ORDER BY r'
                ).fetchall()
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, self.location) from None
        return [str(r[0]) for r in rows]

    def _refuse_inherited(self) -> None:
        """A journal opened before ``fork()`` is the parent's in the child: its connections are the
        parent's server sessions, whose advisory locks stack, so a claim through one would succeed
        while the parent holds the run, and its unlock would drop the parent's. Reads too: the child's
        query on a pooled socket interleaves with the parent's protocol stream on it (answers cross,
        both processes wait for ever), and a connection the child breaks is lost to the parent."""
        if os.getpid() != self._pid:
            raise JournalInherited(
                f"{self.location}: this journal was opened before fork() by the parent process, whose server "
                "sessions (and the run locks they hold) the child shares: open the journal again in this "
                "process; nothing was written or sent"
            )

    def _connection(self) -> contextlib.AbstractContextManager[psycopg.Connection[tuple[Any, ...]]]:
        """A pooled connection, for this journal's process only: every read and write takes it here."""
        self._refuse_inherited()
        return self._pool.connection()

    def close(self) -> None:
        for claim in list(self._claims.values()):
            self.release(claim)
        self._renewing.set()
        if self._renewer is not None and os.getpid() == self._pid:
            self._renewer.join()
        if os.getpid() != self._pid:
            # Closing would end the parent's sessions (and drop its runs' locks); psycopg does not
            # close a connection it collects in another process than the one that opened it.
            self._owner_conn = None
            return
        if self._owner_conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._owner_conn.close()
            self._owner_conn = None
        with contextlib.suppress(psycopg.Error, PoolTimeout):
            self._pool.close()

    def __enter__(self) -> PostgresJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _renew(journal: weakref.ref[PostgresJournal], stop: threading.Event, lease_s: float) -> None:
    """The renewal thread: every third of the lease, push the ``alive_until`` of the journal's claims on (on a
    pooled connection, not the claims' own: the renewal must outlive it). One that fails is tried again next
    time; the thread ends with the journal (closed, or collected)."""
    while not stop.wait(lease_s / 3):
        found = journal()
        if found is None:
            return
        found._renew_claims(lease_s / 3)
        del found


def _rows(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """One statement's rows (none for a statement that returns none)."""
    cur = conn.execute(sql, params)
    return list(cur.fetchall()) if cur.description is not None else []
