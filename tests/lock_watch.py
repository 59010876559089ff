"""A sign, for the tests that race two threads of one process, that the race happened.

Those tests pause one thread at a chosen point (a sidecar check reading the ``-shm``, the close of a
creating descriptor, a renewal of owner rows waiting for a connection) and run another meanwhile. The
second thread either finishes while the first is paused, or is kept waiting by a lock the paused thread
holds (``filelocks.no_opens``; a PostgreSQL journal's renewal lock) until the first goes on. Given a
fixed time instead, a slow machine let the first thread go on before the second had even started, and
the test passed without its race. ``WatchedLock`` is the very lock a test watches, noting each thread
that had to wait for it.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any

import pytest

from effectlog.journal import filelocks

SIGN_S = 120.0  # generous for a loaded 2-core machine; only a thread that is stuck elsewhere spends it
PAUSE_S = SIGN_S + 60  # how long a paused thread waits to be let go: longer than the sign may take


class WatchedLock:
    """A lock (the very lock: same exclusion, reentrant if it is), noting the threads that waited for it."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self._waited: set[int] = set()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking=False):
            return True
        self._waited.add(threading.get_ident())  # another thread holds it: this one waits
        return bool(self._lock.acquire(blocking, timeout))

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def waited(self, thread: threading.Thread) -> bool:
        return thread.ident in self._waited


def watch_no_opens(monkeypatch: pytest.MonkeyPatch) -> WatchedLock:
    """Watch ``filelocks``' registry lock, in its place (while no thread holds it: before any thread starts)."""
    watched = WatchedLock(filelocks.no_opens())
    monkeypatch.setattr(filelocks, "_registry_lock", watched)
    return watched


def wait_done_or_kept_waiting(thread: threading.Thread, watched: WatchedLock, what: str) -> str:
    """Wait until ``thread`` has finished (while the other thread was paused) or is waiting for ``watched``
    (kept out by the paused thread); which of the two. Fails, naming ``what``, if neither happens within
    ``SIGN_S``: the race the test is about never took place."""
    deadline = time.monotonic() + SIGN_S
    while thread.is_alive() and not watched.waited(thread):
        if time.monotonic() >= deadline:
            pytest.fail(f"{what}: neither finished nor waited for the paused thread's lock within {SIGN_S:g}s")
        thread.join(0.01)
    return "kept waiting" if watched.waited(thread) else "done"


def race(
    paused: threading.Thread,
    reached: threading.Event,
    meanwhile: threading.Thread,
    *,
    go: threading.Event,
    watched: WatchedLock,
    what: str,
) -> list[str]:
    """Start ``paused`` and wait until it sets ``reached`` (its pause point); start ``meanwhile`` and wait
    until it is done or kept waiting for ``watched`` (``wait_done_or_kept_waiting``); then let ``paused`` go
    on (``go``) and join both. The names of the threads still alive after ``SIGN_S`` each (none, when
    neither is stuck)."""
    paused.start()
    assert reached.wait(SIGN_S), f"{what}: the paused thread never reached its pause point"
    meanwhile.start()
    try:
        wait_done_or_kept_waiting(meanwhile, watched, what)
    finally:
        go.set()
    paused.join(SIGN_S)
    meanwhile.join(SIGN_S)
    return [t.name for t in (paused, meanwhile) if t.is_alive()]
