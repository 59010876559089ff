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
  queued attempt. The watcher sleeps in the kernel on an inotify watch of the store's
  directory (``effectlog.fleet.inotify``): every commit, by any process, writes the
  store's ``-wal`` file, and that write wakes it. It then reads ``PRAGMA data_version``
  (SQLite's in-memory count of other connections' commits) and the row only when that
  moved, and wakes the runner only when the row did. The WAL is written before the
  commit is published (its fsync, then the wal-index), so the watcher checks
  ``SQLITE_SETTLE_S`` after the write, and once more ``SQLITE_LATE_S`` later if nothing
  was published yet; while writes keep coming it checks at most once per
  ``SQLITE_TICK_S`` (the old poll's rate, now only while the store is written). While
  nothing is written to the store an idle runner's watcher runs no statement at all; a
  commit that queued nothing (a heartbeat, another run's step, the runner's own writes)
  costs it two reads at most, never a loop (its reads write no file). While the runner
  has no free slot the watcher reads nothing and is not woken by each write: it looks
  whether a slot freed every ``SQLITE_TICK_S``, then checks once. A commit
  published later than that is seen at the next write or the runner's ``--poll-s``. Where inotify is not
  available (not Linux), or the watch ends (the directory deleted), the
  watcher falls back to reading ``PRAGMA data_version`` every ``SQLITE_TICK_S``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from effectlog.fleet.inotify import Inotify
from effectlog.journal import filelocks

CHANNEL = "effectlog_fleet"
NOTIFY = f"NOTIFY {CHANNEL}"
SQLITE_BUMP = (
    "INSERT INTO meta (key, value) VALUES ('fleet_queued', '1')"
    " ON CONFLICT (key) DO UPDATE SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT)"
)
SQLITE_TICK_S = 0.01
SQLITE_SETTLE_S = 0.002  # from a WAL write to the check: the commit's fsync and wal-index update
SQLITE_LATE_S = 0.05  # one more look when a write was not published by the first check
_LISTEN_TICK_S = 0.25  # how soon a PostgreSQL watcher sees it was stopped


Loop = Callable[[threading.Event, threading.Event], None]  # (stopped, listening)


class Watcher:
    """A daemon thread that calls ``wake`` on each signal until ``stop``.

    Returns once the thread listens (or after ``READY_S``), so a signal sent after
    ``watch`` returned is not missed.
    """

    READY_S = 10.0

    def __init__(self, loop: Loop, name: str, on_stop: Callable[[], None] | None = None) -> None:
        self._stopped = threading.Event()
        self._on_stop = on_stop  # wakes a loop asleep in the kernel, which does not watch ``stopped``
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
        if self._on_stop is not None:
            self._on_stop()
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


def watch_sqlite(path: str, wake: Callable[[], None], wanted: Callable[[], bool] | None = None) -> Watcher:
    """Watch the store file's ``fleet_queued`` counter; a change calls ``wake``.

    Asleep on inotify between commits to the file (Linux); elsewhere, or if the watch is
    lost, a ``PRAGMA data_version`` read every ``SQLITE_TICK_S``. While ``wanted()`` is false
    (a runner with every slot busy: its own commits are most of what it would see) a write
    is passed over without a read; the runner claims once a slot frees, so nothing queued
    meanwhile waits for the watcher.
    """
    want = wanted or (lambda: True)
    directory, base = os.path.split(path)
    wal = f"{base}-wal"  # every commit writes it; a checkpoint writing the store file changes no row
    stop_r, stop_w = os.pipe()

    def loop(stopped: threading.Event, listening: threading.Event) -> None:
        # SQLite's own connection: it shares the process's descriptors and locks of the file
        # (SQLite defers closing a descriptor another connection's lock depends on). Registered as
        # effectlog's other connections are (filelocks): no descriptor of the file is closed under it.
        notify = Inotify.open(directory or ".")  # before the first read: no commit after it goes unseen
        try:  # the watch and the pipe's end are closed however this ends (the store may be gone already)
            shared = filelocks.acquire(path, write=False)
            try:
                db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=1.0)
                filelocks.opened(db, path)
                try:
                    seen = _Seen(db, wake)
                    listening.set()
                    _watch_file(notify, seen, wal, want, stopped, stop_r)
                finally:
                    if filelocks.may_close(db):
                        db.close()
            finally:
                filelocks.release(shared)  # after the connection: see filelocks
        finally:
            if notify is not None:
                notify.close()
            os.close(stop_r)

    unsent = [stop_w]

    def on_stop() -> None:  # once: a closed descriptor's number may be another file's by now
        while unsent:
            fd = unsent.pop()
            with contextlib.suppress(OSError):
                os.write(fd, b"x")
            os.close(fd)

    return Watcher(loop, "effectlog-watch", on_stop)


def _watch_file(  # noqa: PLR0917 - the watcher's parts, one call site
    notify: Inotify | None, seen: _Seen, wal: str, want: Callable[[], bool], stopped: threading.Event, stop_r: int
) -> None:
    """Check ``seen`` after each write of the ``-wal`` (inotify), or every ``SQLITE_TICK_S`` without a watch."""
    if notify is not None:
        while notify.wait(stop_r):
            changes = notify.read()
            if changes.lost:
                break  # the watch ended: poll below
            if not changes.written(wal):
                continue
            if not want() and not _until_wanted(notify, want, stopped):
                break  # stopped, or the watch ended
            if not _follow(notify, seen, wal, stopped):
                break  # the watch ended (poll below), or stopped
    while not stopped.wait(SQLITE_TICK_S):
        if want():
            seen.check()


class _Seen:
    """The last ``data_version`` and queued count a watcher saw; ``check`` wakes the runner when the count moved."""

    def __init__(self, db: sqlite3.Connection, wake: Callable[[], None]) -> None:
        self.db, self.wake = db, wake
        self.version, self.count = self._version(), _queued(db)

    def _version(self) -> int:
        return int(self.db.execute("PRAGMA data_version").fetchone()[0])

    def check(self) -> bool:
        """Whether another connection committed since the last check (and wake if the count moved)."""
        version = self._version()
        if version == self.version:
            return False
        self.version, count = version, _queued(self.db)
        if count != self.count:
            self.wake()
        self.count = count
        return True


def _until_wanted(notify: Inotify, want: Callable[[], bool], stopped: threading.Event) -> bool:
    """A busy runner's watcher: asleep until ``want()`` (a look every ``SQLITE_TICK_S``), not woken by each
    write. Its runner's own appends are most of those (six commits a run, each waking it ~15 µs of CPU
    and a thread switch, ~0.2 ms a run); nothing queued meanwhile waits for it, since the runner claims
    when a slot frees. Then the writes queued meanwhile are dropped: the check that follows covers them.
    False when the watcher was stopped or the watch ended."""
    while not want():
        if stopped.wait(SQLITE_TICK_S):
            return False
    return not notify.read().lost


def _follow(notify: Inotify, seen: _Seen, wal: str, stopped: threading.Event) -> bool:
    """After a WAL write: check once it had time to be published; again each ``SQLITE_TICK_S`` while more
    writes come; once ``SQLITE_LATE_S`` later if the last check found nothing published and nothing newer was
    written. False when the watch was lost or the watcher stopped."""
    delay = SQLITE_SETTLE_S
    while not stopped.wait(delay):
        changes = notify.read()  # writes made meanwhile: this check covers those already published
        if changes.lost:
            return False
        more = changes.written(wal)
        published = seen.check()
        if more:
            delay = SQLITE_TICK_S
        elif published or delay == SQLITE_LATE_S:
            return True
        else:
            delay = SQLITE_LATE_S
    return False


def _queued(db: sqlite3.Connection) -> str | None:
    row = db.execute("SELECT value FROM meta WHERE key = 'fleet_queued'").fetchone()
    return None if row is None else str(row[0])
