"""The PostgreSQL journal's schema and SQL: migrations, the owners table, advisory lock classes,
statements, and how psycopg's errors read to a user. ``PostgresJournal`` uses them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import PoolTimeout

from effectlog.errors import EffectlogError, JournalLocked, StorageError
from effectlog.journal.protocol import SCHEMA_VERSION

SCHEMA = "effectlog"
# Advisory lock classes (the first key of the two-int form), 'EFL' + a tag byte,
# so our locks never collide with an application's single-bigint advisory locks.
MIGRATE_LOCK_CLASS = 0x45464C00
RUN_LOCK_CLASS = 0x45464C01
OWNER_LOCK_CLASS = 0x45464C02


def pin_search_path(conn: psycopg.Connection[Any]) -> None:
    """Resolve every name this session's statements leave unqualified (``hashtext``, the advisory lock
    functions, operators) in pg_catalog alone. The session's own ``search_path`` (a role's setting, a
    URL's ``options``) may name a schema before pg_catalog: an application's ``public.hashtext(text)``
    then gave one run a second lock key, and a second live owner. effectlog names its own tables with
    their schema, so nothing else is looked up there."""
    conn.execute("SET search_path = pg_catalog, pg_temp")


def configure_session(conn: psycopg.Connection[Any], settings: Mapping[str, str]) -> None:
    """Every pooled session of the journal and of the fleet store, before its first use.

    - The search path pinned (``pin_search_path``).
    - READ COMMITTED whatever the server's default: the head query after the run lock, and the
      fleet's lease checks, must take a fresh snapshot that includes the previous holder's commit.
    - A commit is durable when the server says so: a server, database or role whose default is
      ``synchronous_commit = off`` acknowledges before the WAL is written, and a crash loses the
      last appends (a resume sent their steps again) or the fleet's last transitions. Any stronger
      default (``remote_apply``, ...) is kept.
    - Never ended for being idle (``keep_when_idle``).
    - The settings given explicitly last, so they still win.
    """
    pin_search_path(conn)
    keep_when_idle(conn)
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    conn.execute(
        "SELECT set_config('synchronous_commit', 'on', false) WHERE current_setting('synchronous_commit') = 'off'"
    )
    for name, value in settings.items():
        conn.execute("SELECT set_config(%s, %s, false)", (name, value))


def keep_when_idle(conn: psycopg.Connection[Any]) -> None:
    """No ``idle_session_timeout`` (PostgreSQL 14+) for this session, whatever the server's, database's or
    role's default: a claim's connection idles through the owner's tool calls and holds its run's lock,
    and the renewal's pooled connection idles a third of the lease between renewals. Ended by the server,
    the lock is gone and no renewal lands: the run is taken over while its owner is inside a call."""
    conn.execute(
        "SELECT set_config('idle_session_timeout', '0', false)"
        " WHERE current_setting('server_version_num')::int >= 140000"
    )


# Ordered migrations: index i brings schema version i to i + 1. DDL is transactional
# in PostgreSQL, so a migration applies whole or not at all.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}",
        f"CREATE TABLE {SCHEMA}.meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        f"""CREATE TABLE {SCHEMA}.events (
            run_id TEXT NOT NULL,
            seq BIGINT NOT NULL CHECK (seq > 0),
            step_id TEXT NOT NULL,
            phase TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            body BYTEA NOT NULL,
            hash BYTEA NOT NULL CHECK (octet_length(hash) = 32),
            CONSTRAINT events_pkey PRIMARY KEY (run_id, seq),
            CONSTRAINT events_dedup UNIQUE (run_id, step_id, phase, attempt)
        )""",
        f"""CREATE FUNCTION {SCHEMA}.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'effectlog: % on %.% refused: events are append-only',
                    TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME;
            END $$""",
        # Statement level: fires even when the statement matches no row, and covers TRUNCATE.
        f"""CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON {SCHEMA}.events
            FOR EACH STATEMENT EXECUTE FUNCTION {SCHEMA}.refuse_change()""",
        f"ALTER TABLE {SCHEMA}.events ENABLE ALWAYS TRIGGER events_append_only",
    ),
)
assert len(MIGRATIONS) == SCHEMA_VERSION

INSERT = (
    f"INSERT INTO {SCHEMA}.events (run_id, seq, step_id, phase, attempt, body, hash)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s)"
)
META_KEYS = f"SELECT key, value FROM {SCHEMA}.meta WHERE key IN ('chain', 'key_fingerprint')"
# The key's fingerprint (``keycheck``): added once, never replaced.
INSERT_FINGERPRINT = (
    f"INSERT INTO {SCHEMA}.meta (key, value) VALUES ('key_fingerprint', %s) ON CONFLICT (key) DO NOTHING"
)
# The journal's last event (by primary key) and the hash it chains from (``keycheck.LastLink``).
LAST_LINK = (
    f"SELECT e.run_id, e.seq, (SELECT p.hash FROM {SCHEMA}.events p WHERE p.run_id = e.run_id AND p.seq = e.seq - 1),"
    f" e.body, e.hash FROM (SELECT run_id, seq, body, hash FROM {SCHEMA}.events ORDER BY run_id DESC, seq DESC"
    " LIMIT 1) e"
)
HEAD = f"SELECT seq, hash FROM {SCHEMA}.events WHERE run_id = %s ORDER BY seq DESC LIMIT 1"
READ = (
    f"SELECT seq, body, hash, step_id, phase, attempt FROM {SCHEMA}.events WHERE run_id = %s AND seq > %s ORDER BY seq"
)
LOCK_RUN = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"
# ``alive_until``: the server-clock epoch second until which the owner's process renews its claim
# (``PostgresJournal``'s renewals, a thread of the owner's process on a pooled connection); 0 once released.
# The claim's session lock ends with its connection; the process, and a tool call it has in flight, may
# not: until then nobody else takes the run, unless that process is known to be gone (``may_still_act``).
OWNERS_DDL: tuple[str, ...] = (
    f"CREATE TABLE IF NOT EXISTS {SCHEMA}.owners"
    " (run_id TEXT PRIMARY KEY, token BIGINT NOT NULL, holder TEXT NOT NULL,"
    " alive_until DOUBLE PRECISION NOT NULL DEFAULT 0, renewed_on DOUBLE PRECISION NOT NULL DEFAULT 0,"
    " lease_s DOUBLE PRECISION NOT NULL DEFAULT 0)",
)
ADD_ALIVE_UNTIL = (
    f"ALTER TABLE {SCHEMA}.owners ADD COLUMN IF NOT EXISTS alive_until DOUBLE PRECISION NOT NULL DEFAULT 0"
)
HAS_ALIVE_UNTIL = (
    "SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = %s::regclass AND attname = 'alive_until'"
    " AND NOT attisdropped"
)
# ``renewed_on``: the start of the server (``pg_postmaster_start_time``) that took the claim's last renewal.
ADD_RENEWED_ON = f"ALTER TABLE {SCHEMA}.owners ADD COLUMN IF NOT EXISTS renewed_on DOUBLE PRECISION NOT NULL DEFAULT 0"
HAS_RENEWED_ON = HAS_ALIVE_UNTIL.replace("'alive_until'", "'renewed_on'")
# ``lease_s``: the owner's lease (``owner_lease_s``), which a restart's grace lasts at least (OWNER_RENEWED).
ADD_LEASE_S = f"ALTER TABLE {SCHEMA}.owners ADD COLUMN IF NOT EXISTS lease_s DOUBLE PRECISION NOT NULL DEFAULT 0"
HAS_LEASE_S = HAS_ALIVE_UNTIL.replace("'alive_until'", "'lease_s'")
_NOW = "extract(epoch FROM clock_timestamp())::float8"
_SERVER_START = "extract(epoch FROM pg_catalog.pg_postmaster_start_time())::float8"
UPSERT_OWNER = (  # (run_id, holder, lease_s, lease_s)
    f"INSERT INTO {SCHEMA}.owners (run_id, token, holder, alive_until, renewed_on, lease_s)"
    f" VALUES (%s, 1, %s, {_NOW} + %s, {_SERVER_START}, %s)"
    f" ON CONFLICT (run_id) DO UPDATE SET token = {SCHEMA}.owners.token + 1, holder = EXCLUDED.holder,"
    " alive_until = EXCLUDED.alive_until, renewed_on = EXCLUDED.renewed_on, lease_s = EXCLUDED.lease_s"
    " RETURNING token"
)
OWNER_ROW = f"SELECT token, holder FROM {SCHEMA}.owners WHERE run_id = %s"
# The row and whether its owner still renews it; through to_jsonb, so that a reader of a journal no writer
# of this version has opened yet (no such column) reads it too (never renewed).
#
# A claim whose last renewal an earlier start of the server took (``renewed_on``; a restart, a reboot) counts
# as renewed for its owner's lease (``lease_s``; at least the default lease) after this start: nobody could
# renew while the server was down, and a restart longer than the lease let the first claim after it take the
# run over before its live owner, inside a call, had a turn to renew (an owner renews every third of its
# lease, so a grace of the default 15 s left a window for an owner with a longer lease). A dead host's runs
# wait that much more after a restart; a released claim (0) and a gone owner of this host do not.
_ALIVE_UNTIL = "COALESCE((to_jsonb(o) ->> 'alive_until')::float8, 0)"
_RENEWED_ON = "COALESCE((to_jsonb(o) ->> 'renewed_on')::float8, 0)"
RESTART_GRACE_S = 15.0  # the default owner lease (``postgres.OWNER_LEASE_S``): the shortest grace
_GRACE = f"GREATEST({RESTART_GRACE_S}, COALESCE((to_jsonb(o) ->> 'lease_s')::float8, 0))"
OWNER_RENEWED = (
    f"SELECT o.token, o.holder, {_ALIVE_UNTIL} > {_NOW} OR ({_ALIVE_UNTIL} > 0 AND {_RENEWED_ON} < {_SERVER_START}"
    f" AND {_NOW} < {_SERVER_START} + {_GRACE})"
    f" FROM {SCHEMA}.owners o WHERE o.run_id = %s"
)
RENEW_OWNERS = (  # (lease_s, lease_s, run ids, tokens)
    f"UPDATE {SCHEMA}.owners o SET alive_until = {_NOW} + %s, renewed_on = {_SERVER_START}, lease_s = %s"
    " FROM unnest(%s::text[], %s::bigint[]) AS c (run_id, token) WHERE o.run_id = c.run_id AND o.token = c.token"
)
END_OWNER = f"UPDATE {SCHEMA}.owners SET alive_until = 0 WHERE run_id = %s AND token = %s"


def translate(exc: Exception, where: str) -> EffectlogError:
    """A psycopg or pool error as an effectlog error, worded for the reader."""
    if isinstance(exc, EffectlogError):
        return exc
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, PoolTimeout):
        return StorageError(f"{where}: no database connection available ({text})")
    if isinstance(exc, pg_errors.LockNotAvailable):
        return JournalLocked(f"{where}: another writer holds this run's lock for too long ({text})")
    if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
        return StorageError(f"{where}: journal is read-only ({text})")
    if isinstance(exc, pg_errors.DiskFull):
        return StorageError(f"{where}: disk full while writing the journal ({text})")
    if isinstance(exc, pg_errors.InsufficientPrivilege):
        return StorageError(f"{where}: permission denied ({text})")
    if isinstance(exc, psycopg.OperationalError):
        return StorageError(f"{where}: cannot use the database ({text})")
    return StorageError(f"{where}: {text}")
