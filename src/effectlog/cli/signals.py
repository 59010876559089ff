"""SIGINT and SIGTERM during ``effectlog run``: stop after the current step's durable commit.

The first signal asks the runtime to stop before its next step: the step in flight
finishes and its result is committed, then the run returns, still open and
resumable, and ``effectlog run`` exits 130 (SIGINT) or 143 (SIGTERM). The handlers
are then back to the default action, so a second signal ends the process at once,
without waiting for a hung tool. The journal survives that as it survives SIGKILL:
SQLite commits a transaction whole or not at all.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType
from typing import Protocol

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stoppable(Protocol):
    def request_stop(self, signum: int) -> None: ...


@contextlib.contextmanager
def stop_on_signals(runtime: Stoppable) -> Iterator[None]:
    """Within the block, SIGINT/SIGTERM request a stop at the next step boundary (then default again)."""
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}

    def handler(signum: int, frame: FrameType | None) -> None:
        for each in STOP_SIGNALS:  # one graceful stop; the next signal is not caught
            signal.signal(each, signal.SIG_DFL)
        runtime.request_stop(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
