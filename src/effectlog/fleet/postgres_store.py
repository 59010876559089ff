"""The fleet store on PostgreSQL: many runner hosts, one database.

The fleet tables live in schema ``effectlog_fleet``, beside the runs' journal
(schema ``effectlog``) in the same database. Leases are timed by the database's
clock, so the runners' clocks never matter. Rows are locked, never tables: a claim
locks the request's current attempt ``FOR UPDATE SKIP LOCKED`` (two runners never
wait on each other for the same request), a fenced write ``FOR SHARE``, recovery and
operators ``FOR UPDATE``. The database enforces the same invariants as on SQLite,
with triggers that fire even under ``session_replication_role = replica``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from effectlog.canonical import canonical_json
from effectlog.chain import Chain
from effectlog.errors import BadInput, IntegrityError, JournalInherited, JournalUnreadable
from effectlog.events import Event
from effectlog.fleet import attempts as am
from effectlog.fleet import limits, wakeups
from effectlog.fleet.fencing import Tx
from effectlog.fleet.leased_journal import LeasedJournal
from effectlog.fleet.model import Lease, Move
from effectlog.fleet.postgres_journal import FLEET_SCHEMA, POSTGRES, FleetPostgresJournal, PgTx, translate
from effectlog.fleet.sqlstore import Change, SqlFleetStore
from effectlog.journal.postgres_schema import RUN_LOCK_CLASS, configure_session
from effectlog.journal.postgres_schema import SCHEMA as JOURNAL_SCHEMA
from effectlog.journal.sidecars import masked

FLEET_SCHEMA_VERSION = 3
FLEET_MIGRATE_LOCK = (0x45464C02, 0)  # 'EFL' + 2: beside the journal's advisory lock classes
_S = FLEET_SCHEMA
_FINAL = am.sql_list(am.FINAL)
_LEASED = am.move(am.QUEUED, "lease", "scheduler")  # what a claim makes of a queued attempt


def _guard(table: str, body: str) -> tuple[str, ...]:
    return (
        f"""CREATE FUNCTION {_S}.guard_{table}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF TG_OP = 'DELETE' THEN
                    RAISE EXCEPTION 'effectlog: DELETE on {_S}.{table} refused: it is history';
                END IF;
                {body}
                RETURN NEW;
            END $$""",
        f"""CREATE TRIGGER {table}_guard BEFORE UPDATE OR DELETE ON {_S}.{table}
            FOR EACH ROW EXECUTE FUNCTION {_S}.guard_{table}()""",
        f"ALTER TABLE {_S}.{table} ENABLE ALWAYS TRIGGER {table}_guard",
        f"""CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {_S}.{table}
            FOR EACH STATEMENT EXECUTE FUNCTION {_S}.refuse_change()""",
        f"ALTER TABLE {_S}.{table} ENABLE ALWAYS TRIGGER {table}_no_truncate",
    )


def _append_only(table: str) -> tuple[str, ...]:
    return (
        f"""CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON {_S}.{table}
            FOR EACH STATEMENT EXECUTE FUNCTION {_S}.refuse_change()""",
        f"ALTER TABLE {_S}.{table} ENABLE ALWAYS TRIGGER {table}_append_only",
    )


def _raise(message: str) -> str:
    return f"RAISE EXCEPTION 'effectlog: {message}';"


DDL: tuple[str, ...] = (
    f"CREATE SCHEMA IF NOT EXISTS {_S}",
    f"CREATE TABLE {_S}.meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    f"""CREATE TABLE {_S}.requests (
        request_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        scope TEXT NOT NULL,
        idem_key TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        run_id TEXT NOT NULL CONSTRAINT requests_run_id UNIQUE,
        plan TEXT NOT NULL,
        requires TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        current_attempt BIGINT,
        cancel_requested_at DOUBLE PRECISION,
        cancel_by TEXT,
        cancel_reason TEXT,
        finished_at DOUBLE PRECISION,
        CONSTRAINT requests_scope_key UNIQUE (scope, idem_key)
    )""",
    f"""CREATE TABLE {_S}.attempts (
        attempt_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        request_id BIGINT NOT NULL REFERENCES {_S}.requests (request_id),
        attempt_no INTEGER NOT NULL,
        state TEXT NOT NULL,
        runner_id TEXT,
        fencing_token BIGINT,
        lease_expires_at DOUBLE PRECISION,
        base_seq BIGINT,
        created_at DOUBLE PRECISION NOT NULL,
        CONSTRAINT attempts_no UNIQUE (request_id, attempt_no),
        CONSTRAINT attempts_token UNIQUE (request_id, fencing_token)
    )""",
    f"CREATE UNIQUE INDEX attempts_one_open ON {_S}.attempts (request_id) WHERE state NOT IN {_FINAL}",
    f"CREATE INDEX attempts_state ON {_S}.attempts (state, lease_expires_at)",
    f"""CREATE TABLE {_S}.history (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        attempt_id BIGINT NOT NULL,
        request_id BIGINT NOT NULL,
        transition TEXT NOT NULL,
        event TEXT NOT NULL,
        actor TEXT NOT NULL,
        actor_name TEXT NOT NULL,
        from_state TEXT NOT NULL,
        to_state TEXT NOT NULL,
        reason TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        detail TEXT NOT NULL
    )""",
    f"CREATE INDEX history_request ON {_S}.history (request_id, id)",
    f"""CREATE TABLE {_S}.operations (
        attempt_id BIGINT NOT NULL,
        op_key TEXT NOT NULL,
        digest TEXT NOT NULL,
        result TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (attempt_id, op_key)
    )""",
    f"""CREATE FUNCTION {_S}.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'effectlog: % on %.% refused: it is append-only', TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME;
        END $$""",
    *_append_only("history"),
    *_append_only("operations"),
    *_guard(
        "attempts",
        f"""IF NEW.attempt_id <> OLD.attempt_id OR NEW.request_id <> OLD.request_id
                    OR NEW.attempt_no <> OLD.attempt_no OR NEW.created_at <> OLD.created_at THEN
                    {_raise("an attempt''s identity is immutable")}
                END IF;
                IF OLD.fencing_token IS NOT NULL AND (NEW.fencing_token IS DISTINCT FROM OLD.fencing_token
                    OR NEW.runner_id IS DISTINCT FROM OLD.runner_id OR NEW.base_seq IS DISTINCT FROM OLD.base_seq) THEN
                    {_raise("a lease''s runner, fencing token and base are immutable")}
                END IF;
                IF OLD.state IN {_FINAL} THEN
                    {_raise("a finished attempt never changes")}
                END IF;""",
    ),
    *_guard(
        "requests",
        f"""IF (NEW.request_id, NEW.scope, NEW.idem_key, NEW.fingerprint, NEW.run_id, NEW.plan, NEW.requires,
                    NEW.created_at) IS DISTINCT FROM (OLD.request_id, OLD.scope, OLD.idem_key, OLD.fingerprint,
                    OLD.run_id, OLD.plan, OLD.requires, OLD.created_at) THEN
                    {_raise("a request''s identity is immutable")}
                END IF;
                IF OLD.cancel_requested_at IS NOT NULL AND (NEW.cancel_requested_at, NEW.cancel_by, NEW.cancel_reason)
                    IS DISTINCT FROM (OLD.cancel_requested_at, OLD.cancel_by, OLD.cancel_reason) THEN
                    {_raise("a cancellation is recorded once")}
                END IF;
                IF OLD.finished_at IS NOT NULL AND NEW.finished_at IS DISTINCT FROM OLD.finished_at THEN
                    {_raise("a request ends once")}
                END IF;""",
    ),
)


# ``SqlFleetStore.claim_next`` as one statement, the body of the database function ``claim_next``
# (schema v3). The lease's token is ``MAX(fencing_token) + 1`` over the request's attempts and its
# base the run's head, as in ``claim``; the history row is the one ``_history`` writes (detail
# ``{"token":N}``, canonical JSON). The pick reads the queued attempts in ``attempts_queued`` order
# (oldest request first) and looks up each one's requirements as it goes, so a claim reads the
# queue's head, not the whole queue.
_CLAIM_BODY = f"""
WITH clock AS (SELECT extract(epoch FROM clock_timestamp())::float8 AS t),
pick AS (
    SELECT a.attempt_id FROM {_S}.attempts a
    WHERE a.state = '{am.QUEUED}' AND (a.not_before IS NULL OR a.not_before <= (SELECT t FROM clock))
      AND (SELECT r.requires FROM {_S}.requests r WHERE r.request_id = a.request_id)::jsonb <@ p_offered::jsonb
    ORDER BY a.request_id LIMIT p_limit
    FOR UPDATE OF a SKIP LOCKED
),
leased AS (
    UPDATE {_S}.attempts a SET state = '{_LEASED}', runner_id = p_runner,
        fencing_token = (SELECT COALESCE(MAX(b.fencing_token), 0) + 1 FROM {_S}.attempts b
                         WHERE b.request_id = a.request_id),
        lease_expires_at = clock.t + p_lease_s,
        base_seq = (SELECT COALESCE(MAX(e.seq), 0) FROM {JOURNAL_SCHEMA}.events e WHERE e.run_id = r.run_id)
    FROM pick, clock, {_S}.requests r
    WHERE a.attempt_id = pick.attempt_id AND r.request_id = a.request_id AND a.state = '{am.QUEUED}'
    RETURNING a.attempt_id, a.request_id, a.attempt_no, a.fencing_token, a.lease_expires_at, r.run_id, r.plan,
        r.cancel_requested_at, clock.t, a.base_seq
),
recorded AS (
    INSERT INTO {_S}.history (attempt_id, request_id, transition, event, actor, actor_name, from_state, to_state,
        reason, at, detail)
    SELECT attempt_id, request_id, 'lease', '{am.event_of("lease")}', 'scheduler', p_runner, '{am.QUEUED}',
        '{_LEASED}', '', t, '{{"token":' || fencing_token || '}}'
    FROM leased ORDER BY request_id
)
SELECT * FROM leased ORDER BY request_id
"""

# Why a function, and why its settings: the planner picks the queue's rows by its statistics, and
# a store whose tables have none yet (a new store, or a burst of submissions before autovacuum's
# ANALYZE), or whose statistics remember a short queue, is estimated to hold a few queued rows;
# it then reads and joins EVERY queued row and sorts them to lease the first, so a claim's server
# CPU grew with the backlog (1 claimer: 0.7 ms per claim with 200 queued, 2.2 ms with 1,600).
# Inside the function sorts, bitmap and sequential scans are off, which leaves the index paths: the
# ordered scan of ``attempts_queued`` stopping at the first row that fits, and key look-ups. A
# disabled path is priced very high rather than forbidden, and that price would cross
# ``jit_above_cost``, so JIT (hundreds of ms of compiling per call) is off too. PL/pgSQL keeps
# the plan per connection, so the statement is planned once, not per claim.
_CLAIM_FUNCTION = f"""CREATE FUNCTION {_S}.claim_next(p_offered text, p_limit integer, p_runner text,
    p_lease_s double precision)
RETURNS TABLE (attempt_id bigint, request_id bigint, attempt_no integer, fencing_token bigint,
    lease_expires_at double precision, run_id text, plan text, cancel_requested_at double precision,
    t double precision, base_seq bigint)
LANGUAGE plpgsql VOLATILE
SET enable_sort = off SET enable_bitmapscan = off SET enable_seqscan = off SET jit = off
AS $claim$
#variable_conflict use_column
BEGIN
    RETURN QUERY {_CLAIM_BODY.strip()};
END $claim$"""

# Parameters: the capabilities offered (a JSON array), limit, runner, lease seconds.
CLAIM_SIGNATURE = f"{_S}.claim_next(text, integer, text, double precision)"
CLAIM_NEXT = f"SELECT * FROM {_S}.claim_next(%s, %s, %s, %s)"


_NOT_OURS = (
    f"{{location}}: schema {FLEET_SCHEMA} exists but is not an effectlog fleet (it holds another application's "
    "tables or functions); nothing was changed"
)
_HAS_META = "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = %s AND tablename = 'meta'"

# What each version adds to the one before (a new store is created at v1 and migrated).
MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: (  # poison requests: a per-request limit on automatic requeues, with backoff between them
        f"ALTER TABLE {_S}.requests ADD COLUMN max_requeues INTEGER NOT NULL DEFAULT {limits.DEFAULT_MAX_REQUEUES}",
        f"ALTER TABLE {_S}.requests ADD COLUMN requeue_backoff_s DOUBLE PRECISION NOT NULL"
        f" DEFAULT {limits.DEFAULT_REQUEUE_BACKOFF_S}",
        f"ALTER TABLE {_S}.attempts ADD COLUMN not_before DOUBLE PRECISION",
    ),
    3: (  # claims read the queue's head, not the whole queue (``_CLAIM_FUNCTION``)
        f"CREATE INDEX attempts_queued ON {_S}.attempts (request_id) WHERE state = '{am.QUEUED}'",
        _CLAIM_FUNCTION,
    ),
}


# A lease owner's transition in one statement: move the attempt (guarded by its state), its
# history row and operation record, and the request's end when the new state is final; what
# ``SqlFleetStore._transition`` + ``record_operation`` do in four. Returns (moved, ended).
OWNER_MOVE = f"""
WITH moved AS (
    UPDATE {_S}.attempts SET state = %s WHERE attempt_id = %s AND state = %s
    RETURNING attempt_id, request_id, %s::text AS from_state
),
recorded AS (
    INSERT INTO {_S}.history (attempt_id, request_id, transition, event, actor, actor_name, from_state, to_state,
        reason, at, detail)
    SELECT attempt_id, request_id, %s, %s, %s, %s, from_state, %s, %s, %s, %s FROM moved
),
operation AS (
    INSERT INTO {_S}.operations (attempt_id, op_key, digest, result, at)
    SELECT attempt_id, %s, %s, %s, %s FROM moved
),
ended AS (
    UPDATE {_S}.requests r SET finished_at = %s FROM moved
    WHERE %s AND r.request_id = moved.request_id AND r.finished_at IS NULL
    RETURNING r.request_id
)
SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM ended)
"""


class PostgresFleetStore(SqlFleetStore):
    """A fleet store in one PostgreSQL database; every runner host connects to the same URL."""

    def __init__(
        self,
        url: str,
        *,
        chain: Chain | None = None,
        pool_size: int = 4,
        lock_timeout_s: float = 10.0,
        idle_in_transaction_timeout_s: float = 60.0,
        create: bool = True,
    ) -> None:
        self.location = masked(url)
        self.dialect = POSTGRES
        self._create = create  # False: a database without the fleet's schema is refused, not given it
        try:
            params = conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            raise BadInput(f"{self.location}: not a usable PostgreSQL URL ({exc})") from None
        self._settings = {
            "lock_timeout": f"{int(lock_timeout_s * 1000)}ms",
            "idle_in_transaction_session_timeout": f"{int(idle_in_transaction_timeout_s * 1000)}ms",
        }
        kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in params:
            kwargs["connect_timeout"] = 10
        if "application_name" not in params:
            kwargs["application_name"] = "effectlog-fleet"
        self._url, self._kwargs = url, kwargs
        self._pid = os.getpid()  # a child of fork() shares the pool's server sessions: see _connection
        self._watcher: wakeups.Watcher | None = None
        if not create:  # before the journal below would give the database its schema
            self._refuse_if_no_fleet()
        # The journal first: it creates (or checks) schema `effectlog` that claims and recovery read.
        self._journal = FleetPostgresJournal(
            url,
            chain=chain,
            pool_size=pool_size,
            lock_timeout_s=lock_timeout_s,
            idle_in_transaction_timeout_s=idle_in_transaction_timeout_s,
        )
        try:
            with psycopg.connect(url, **kwargs) as conn:
                self._configure(conn)
                self._migrate(conn)
            self._pool: ConnectionPool[psycopg.Connection[tuple[Any, ...]]] = ConnectionPool(
                url,
                kwargs=kwargs,
                min_size=1,
                max_size=max(1, pool_size),
                configure=self._configure,
                open=False,
                name="effectlog-fleet",
            )
            self._pool.open(wait=True, timeout=float(kwargs.get("connect_timeout", 10)) + 5)
        except (psycopg.Error, PoolTimeout) as exc:
            self._journal.close()
            raise translate(exc, self.location) from None
        except BaseException:
            self._journal.close()
            raise

    def _refuse_if_no_fleet(self) -> None:
        """A database without the fleet's ``meta`` table or its journal's, opened for existing requests:
        refused, read only (the journal would make its schema anew beside a fleet whose runs it lost)."""
        try:
            with psycopg.connect(self._url, **self._kwargs) as conn:
                fleet, journal = (
                    conn.execute(_HAS_META, (schema,)).fetchone() for schema in (FLEET_SCHEMA, JOURNAL_SCHEMA)
                )
                foreign = fleet is None and self._foreign(conn)
        except psycopg.Error as exc:
            raise translate(exc, self.location) from None
        if foreign:
            raise JournalUnreadable(_NOT_OURS.format(location=self.location))
        if fleet is None:
            raise JournalUnreadable(f"{self.location}: not a fleet store (no fleet schema); nothing was changed")
        if journal is None:
            raise JournalUnreadable(
                f"{self.location}: a fleet store without its journal (schema {JOURNAL_SCHEMA} is gone: dropped, or "
                "restored apart); its runs' history is not here; nothing was changed"
            )

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        configure_session(conn, self._settings)  # as the journal's sessions: search path, durability

    @staticmethod
    def _foreign(conn: psycopg.Connection[Any]) -> bool:
        """Whether the fleet's schema, without its ``meta`` table, holds anything: another application's
        schema of that name (an empty one, made by an administrator for its grants, is ours to fill). Taken
        for a fresh one, its first clashing table failed the DDL with a bare "relation already exists"."""
        found = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
            " ON n.oid = c.relnamespace WHERE n.nspname = %s)"
            " OR EXISTS (SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n"
            " ON n.oid = p.pronamespace WHERE n.nspname = %s)",
            (FLEET_SCHEMA, FLEET_SCHEMA),
        ).fetchone()
        return bool(found and found[0])

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            # Many runners may open a fresh database at once: one creates the schema, the others wait and see it.
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", FLEET_MIGRATE_LOCK)
            exists = conn.execute(_HAS_META, (FLEET_SCHEMA,)).fetchone()
            if exists is None and self._foreign(conn):
                raise JournalUnreadable(_NOT_OURS.format(location=self.location))
            if exists is None and not self._create:
                raise JournalUnreadable(f"{self.location}: not a fleet store (no fleet schema); nothing was changed")
            if exists is None:
                for sql in DDL:
                    conn.execute(sql)  # module constants, never input
                conn.execute(f"INSERT INTO {FLEET_SCHEMA}.meta (key, value) VALUES ('schema_version', '1')")
                version = 1
            else:
                row = conn.execute(f"SELECT value FROM {FLEET_SCHEMA}.meta WHERE key = 'schema_version'").fetchone()
                version = int(row[0]) if row and str(row[0]).isascii() and str(row[0]).isdigit() else 0  # not ²
            if version > FLEET_SCHEMA_VERSION:
                raise JournalUnreadable(
                    f"{self.location}: fleet schema v{version} is newer than this effectlog (v{FLEET_SCHEMA_VERSION})"
                )
            if version < 1:
                raise JournalUnreadable(f"{self.location}: schema {FLEET_SCHEMA} exists but is not an effectlog fleet")
            for step in range(version + 1, FLEET_SCHEMA_VERSION + 1):
                for sql in MIGRATIONS[step]:
                    conn.execute(sql)  # module constants, never input
                conn.execute(f"UPDATE {FLEET_SCHEMA}.meta SET value = %s WHERE key = 'schema_version'", (str(step),))
            # Every claim goes through the v3 function: one dropped since (a clean-up, a restore without
            # functions) left a store that opened and never leased again. Made again if missing, never
            # replaced when present (another effectlog of the same schema version may have written it).
            if conn.execute(f"SELECT to_regprocedure('{CLAIM_SIGNATURE}') IS NULL").fetchone() == (True,):
                conn.execute(_CLAIM_FUNCTION)

    def _connection(self) -> AbstractContextManager[psycopg.Connection[tuple[Any, ...]]]:
        """A pooled connection, in the process that opened the store only: in a child of fork() the pool's
        connections are the parent's server sessions, and a query sent on one interleaves with the parent's
        protocol stream (answers cross, the parent waits for ever), as the journal's ``_connection`` says."""
        if os.getpid() != self._pid:
            raise JournalInherited(
                f"{self.location}: this fleet store was opened before fork() by the parent process, whose server "
                "sessions the child shares: open the store again in this process; nothing was sent"
            )
        return self._pool.connection()

    @contextmanager
    def _transaction(self) -> Iterator[Tx]:
        try:
            with self._connection() as conn, conn.transaction():
                yield PgTx(conn)
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, self.location) from None

    def _claim_next(self, runner_id: str, offered: str, lease_s: float, limit: int) -> list[Lease]:
        """Pick, lease and record the history in ONE statement (its own transaction: one round trip, one commit).

        ``FOR UPDATE OF a SKIP LOCKED`` in the pick: rows another claimer holds are
        passed over, and a row it leased and committed meanwhile is re-checked
        (``state = 'queued'``) and dropped, so a claim never waits and never loses.
        """
        try:
            with self._connection() as conn:
                rows = conn.execute(CLAIM_NEXT, (offered, limit, runner_id, lease_s)).fetchall()
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, self.location) from None
        return [
            Lease(
                request_id=int(r[1]),
                attempt_id=int(r[0]),
                attempt_no=int(r[2]),
                runner_id=runner_id,
                token=int(r[3]),
                expires_at=float(r[4]),
                run_id=str(r[5]),
                plan=str(r[6]),
                cancel_requested=r[7] is not None,
                base_seq=int(r[9]),
            )
            for r in rows
        ]

    def _lock_run_of(self, tx: Tx, attempt_id: int) -> None:
        # The run lock every fenced append holds, taken before the attempt row (appends carrying a
        # transition take the same two in the same order, so the two cannot deadlock).
        tx.one(
            f"SELECT pg_advisory_xact_lock({RUN_LOCK_CLASS}, hashtext(r.run_id)) FROM {_S}.attempts a"
            f" JOIN {_S}.requests r ON r.request_id = a.request_id WHERE a.attempt_id = %s",
            (attempt_id,),
        )

    def _owner_move(self, tx: Tx, lease: Lease, c: Change, move: Move) -> None:
        if c.trigger in am.REQUEUES:  # a lease owner never requeues; keep the general path for it anyway
            super()._owner_move(tx, lease, c, move)
            return
        row = tx.one(
            OWNER_MOVE,
            (
                c.new, c.attempt_id, c.state, c.state,
                c.trigger, am.event_of(c.trigger), c.actor, c.actor_name, c.new, c.reason, c.now,
                canonical_json(c.detail).decode(),
                move.op_key, move.digest(), c.new, c.now,
                c.now, c.new in am.FINAL,
            ),
        )  # fmt: skip
        moved, ended = (0, 0) if row is None else (int(row[0]), int(row[1]))
        if moved != 1:
            raise IntegrityError(
                f"request {c.request_id}: attempt id {c.attempt_id} changed under a locked transition "
                f"({c.state} -> {c.new})"
            )
        if c.new in am.FINAL and ended != 1:
            raise IntegrityError(f"request {c.request_id} would end twice (attempt id {c.attempt_id} -> {c.new})")

    def _queued(self, tx: Tx) -> None:
        tx.run(wakeups.NOTIFY)

    def watch(self, wake: Callable[[], None], wanted: Callable[[], bool] | None = None) -> None:
        del wanted  # a notification costs nothing until something is queued
        if self._watcher is None:
            self._watcher = wakeups.listen_postgres(self._url, self._kwargs, wake)

    def _tx(self, *, write: bool = True) -> AbstractContextManager[Tx]:
        # A read (``write=False``) is its statements alone, no BEGIN/COMMIT: under READ
        # COMMITTED each statement takes its own snapshot inside a transaction too, and
        # reads lock no rows, so a transaction would add two round trips and a commit to
        # every recovery pass and listing, and nothing else.
        return self._transaction() if write else self._reading()

    @contextmanager
    def _reading(self) -> Iterator[Tx]:
        try:
            with self._connection() as conn:
                yield _ReadTx(conn)
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, self.location) from None

    def journal(self) -> FleetPostgresJournal:
        return self._journal

    def leased_journal(
        self, lease: Lease, before_append: Callable[[Sequence[Event]], None] | None = None
    ) -> LeasedJournal:
        return LeasedJournal(self._journal, lease, before_append, self.carry)

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        if os.getpid() == self._pid:  # in a fork child the pool's sessions are the parent's: leave them
            self._pool.close()
        self._journal.close()

    def __enter__(self) -> PostgresFleetStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ReadTx(PgTx):
    """``PgTx`` outside a transaction (autocommit), for reads only: a write through it is a bug."""

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        raise AssertionError(f"a write in a read ({sql[:60]}...)")
