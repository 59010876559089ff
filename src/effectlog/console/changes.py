"""The console's change feed: a cheap version of the journal (and fleet store) that moves on every write.

The journal is append-only, so the number of its events, seals and owner claims only
grows: their counts (one read-only query, no replay) change exactly when something was
written. The fleet store's version is the number of its history rows and its requests'
states. ``/events`` (server-sent events, for the pages, under the session's login) and
``/api/changes?since=V`` (a long poll, for scripts, under a bearer token) both say when
the version moved; the pages' ``static/live.js`` then fetches the page again and swaps
in its live parts, without a reload. A run whose owner dies changes no row, so the feed
also says "changed" every ``REFRESH_S`` seconds whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from effectlog.console import decisions
from effectlog.console.decisions import Config
from effectlog.errors import EffectlogError, JournalUnreadable, StorageError
from effectlog.journal import filelocks
from effectlog.journal.sidecars import is_postgres
from effectlog.journal.sqlite_schema import layout_of

POLL_S = 0.5  # how often a waiting feed reads the version
REFRESH_S = 30.0  # a change is announced at least this often: an owner's death writes nothing
STREAM_S = 300.0  # an event stream ends after this; the browser's EventSource reconnects by itself
_COUNTS = ("events", "seals", "owners")
_LOCK = threading.Lock()
_CACHE: dict[tuple[str, str | None, str | None], tuple[float, str]] = {}


def version(config: Config, run_id: str | None = None) -> str:
    """The journal's (and fleet store's) version: equal versions mean nothing was written in between.

    With ``run_id``, only that run's: a run's page then moves only when its run does. Open
    pages share one read per ``POLL_S`` (a version a moment old only costs a page one
    extra refresh), so ten open tabs do not read the journal ten times as often.
    """
    key = (config.journal, config.store, run_id)
    now = time.monotonic()
    with _LOCK:
        cached = _CACHE.get(key)
    if cached is not None and now - cached[0] < POLL_S * 0.8:
        return cached[1]
    found = _read_version(config, run_id)
    with _LOCK:
        if len(_CACHE) > 1000:  # many run pages were opened once: forget them all
            _CACHE.clear()
        _CACHE[key] = (now, found)
    return found


def _read_version(config: Config, run_id: str | None) -> str:
    parts = [_journal_counts(config.journal, run_id)]
    if config.store is not None and run_id is None:
        parts.append(decisions.with_store(config, _store_version))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _journal_counts(location: str, run_id: str | None) -> str:
    if is_postgres(location):
        return _postgres_counts(location, run_id)
    real = os.path.realpath(location)  # the name the journal's own opens lock and register (SqliteJournal)
    with contextlib.ExitStack() as stack:
        # Registered with filelocks: a page's journal opened in another worker thread meanwhile sees the file
        # open here, and its sidecar check closes no descriptor of the -shm under this connection's locks.
        try:
            db = stack.enter_context(filelocks.registered(real, lambda: _connect_read_only(real)))
        except OSError as exc:
            raise JournalUnreadable(f"{location}: cannot read the journal ({exc.strerror})") from None
        except sqlite3.Error as exc:
            raise JournalUnreadable(f"{location}: cannot read the journal ({exc})") from None
        db.execute("PRAGMA busy_timeout = 5000")
        return ",".join(_count(db, table, run_id, location) for table in _COUNTS)


def _connect_read_only(path: str) -> sqlite3.Connection:
    return sqlite3.connect(Path(path).absolute().as_uri() + "?mode=ro", uri=True, isolation_level=None)


def _count(db: sqlite3.Connection, table: str, run_id: str | None, location: str) -> str:
    what = "coalesce(sum(token), 0)" if table == "owners" else "count(*)"
    where, params = ("WHERE run_id = ?", (run_id,)) if run_id is not None else ("", ())
    try:
        if table == "events" and run_id is not None:  # by the journal's layout (schema v1 or v2)
            return str(db.execute(layout_of(db).count_run, params).fetchone()[0])
        return str(db.execute(f"SELECT {what} FROM {table} {where}", params).fetchone()[0])  # fixed table names
    except sqlite3.Error as exc:
        if "no such table" in str(exc):  # a journal no writer has opened since the table exists
            return "-"
        raise StorageError(f"{location}: cannot read the journal's version ({exc})") from None


def _postgres_counts(url: str, run_id: str | None) -> str:
    import psycopg

    from effectlog.journal.postgres_schema import SCHEMA
    from effectlog.journal.sidecars import masked

    where, params = ("WHERE run_id = %(run)s", {"run": run_id}) if run_id is not None else ("", {})
    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            row = conn.execute(
                f"SELECT (SELECT count(*) FROM {SCHEMA}.events {where}),"  # fixed table names
                f" (SELECT coalesce(sum(token), 0) FROM {SCHEMA}.owners {where})",
                params,
            ).fetchone()
    except psycopg.Error as exc:
        raise StorageError(f"{masked(url)}: cannot read the journal's version ({str(exc).splitlines()[0]})") from None
    return ",".join(str(v) for v in row or ())


def _store_version(store: object) -> str:
    from effectlog.fleet.protocol import FleetStore

    assert isinstance(store, FleetStore)
    states = ";".join(f"{r.request_id}:{r.state}:{r.attempt_no}:{r.cancel_requested}" for r in store.requests())
    return f"{len(store.history())}/{states}"


async def wait_for_change(config: Config, since: str, timeout_s: float, run_id: str | None = None) -> str:
    """The version once it differs from ``since``, or the current one after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = await run_in_threadpool(version, config, run_id)
        if now != since or time.monotonic() >= deadline:
            return now
        await asyncio.sleep(POLL_S)


async def stream(
    config: Config, since: str, is_gone: Callable[[], Awaitable[bool]], run_id: str | None = None
) -> AsyncIterator[str]:
    """Server-sent events: ``event: changed`` with the new version each time it moves (or ``REFRESH_S`` passes).

    A journal that can no longer be read ends the stream with ``event: broken`` and the
    one-line reason (the page says so); the traceback never reaches the browser.
    """
    yield "retry: 2000\n\n"
    try:
        async for event in _events(config, since, is_gone, run_id):
            yield event
    except EffectlogError as exc:
        yield f"event: broken\ndata: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}\n\n"


async def _events(
    config: Config, since: str, is_gone: Callable[[], Awaitable[bool]], run_id: str | None
) -> AsyncIterator[str]:
    ends = time.monotonic() + STREAM_S
    current = since or await run_in_threadpool(version, config, run_id)
    yield f"event: version\ndata: {current}\n\n"
    while time.monotonic() < ends:
        refresh = time.monotonic() + REFRESH_S
        while time.monotonic() < min(refresh, ends):
            if await is_gone():
                return
            now = await run_in_threadpool(version, config, run_id)
            if now != current:
                break
            await asyncio.sleep(POLL_S)
        else:
            now = current
        current = now
        yield f"event: changed\ndata: {current}\n\n"
