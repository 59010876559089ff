"""Waking idle runners when work is queued, instead of a tight poll.

A store signals "an attempt was queued" (a submit, an automatic or an operator's
requeue) in the transaction that queues it; a runner's watcher thread calls
``wake`` when it sees the signal, and the runner's main loop, asleep on its wake
event, claims at once. The runner still wakes every ``--poll-s`` without a signal,
so a backoff running out, an expired lease for the recovery pass, or a lost watcher
connection is noticed anyway: the signal only makes an idle runner faster and quieter.

* PostgreSQL: ``NOTIFY effectlog_fleet`` (delivered on commit, to every host) and a
  ``LISTEN`` on a connection of the watcher's own.
* SQLite (one host): the store's ``meta`` row ``fleet_queued`` is bumped with each
  queued attempt; the watcher reads ``PRAGMA data_version`` (SQLite's in-memory count of
  other connections' commits, no disk read) every ``SQLITE_TICK_S`` and the row only
  when that moved, so an idle runner costs no transaction and no write.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import psycopg

CHANNEL = "effectlog_fleet"
NOTIFY = f"NOTIFY {CHANNEL}"
SQLITE_BUMP = (
    "INSERT INTO meta (key, value) VALUES ('fleet_queued', '1')"
    " ON CONFLICT (key) DO UPDATE SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT)"
)
SQLITE_TICK_S = 0.01
_LISTEN_TICK_S = 0.25  # how soon a PostgreSQL watcher sees it was stopped


Loop = Callable[[threading.Event, threading.Event], None]  # (stopped, listening)


class Watcher:
    """A daemon thread that calls ``wake`` on each signal until ``stop``.

    Returns once the thread listens (or after ``READY_S``), so a signal sent after
    ``watch`` returned is not missed.
    """

    READY_S = 10.0

    def __init__(self, loop: Loop, name: str) -> None:
        self._stopped = threading.Event()
        listening = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(loop, listening), name=name, daemon=True)
        self._thread.start()
        listening.wait(self.READY_S)

    def _run(self, loop: Loop, listening: threading.Event) -> None:
        # A watcher that fails leaves the runner on its --poll-s timeout: slower, never wrong.
        with contextlib.suppress(Exception):
            loop(self._stopped, listening)
        listening.set()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=2 * _LISTEN_TICK_S + 1)


def listen_postgres(url: str, kwargs: dict[str, Any], wake: Callable[[], None]) -> Watcher:
    """``LISTEN effectlog_fleet`` on a connection of its own; each notification calls ``wake``."""

    def loop(stopped: threading.Event, listening: threading.Event) -> None:
        with psycopg.connect(url, **{**kwargs, "autocommit": True, "application_name": "effectlog-wake"}) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            listening.set()
            while not stopped.is_set():
                for _ in conn.notifies(timeout=_LISTEN_TICK_S, stop_after=1):
                    wake()

    return Watcher(loop, "effectlog-listen")


def watch_sqlite(path: str, wake: Callable[[], None]) -> Watcher:
    """Watch the store file's ``fleet_queued`` counter through ``PRAGMA data_version``; a change calls ``wake``."""

    def loop(stopped: threading.Event, listening: threading.Event) -> None:
        # SQLite's own connection: it shares the process's descriptors and locks of the file
        # (SQLite defers closing a descriptor another connection's lock depends on).
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=1.0)
        try:
            seen_version, seen_count = db.execute("PRAGMA data_version").fetchone()[0], _queued(db)
            listening.set()
            while not stopped.wait(SQLITE_TICK_S):
                version = db.execute("PRAGMA data_version").fetchone()[0]
                if version == seen_version:
                    continue
                seen_version, count = version, _queued(db)
                if count != seen_count:
                    wake()
                seen_count = count
        finally:
            db.close()

    return Watcher(loop, "effectlog-watch")


def _queued(db: sqlite3.Connection) -> str | None:
    row = db.execute("SELECT value FROM meta WHERE key = 'fleet_queued'").fetchone()
    return None if row is None else str(row[0])
