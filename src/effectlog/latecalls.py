"""Calls that timed out and still run in this process, and the run claims kept for them.

A tool call on a thread that does not answer within its step's ``timeout_s`` is "outcome unknown":
the step stops uncertain (non-idempotent) or is sent again under its key (idempotent). But a thread
cannot be stopped, and the call goes on in this process; it may still make its effect. A lookup or
a ledger asked meanwhile says "not applied" (the effect is not made yet), the step gets a second
attempt, and then the first call lands: two effects, the journal saying one. Evidence taken while
the call can still land is no evidence. So, until every such call of a run has ended:

- the run's claim is kept (another process's resume or decision gets ``RunOwned``, exit 6), and
- this runtime refuses to drive or decide the run (``CallStillRunning``, exit 6, nothing written).

A process that exits ends its threads, and its claims go with it: then the call can no longer land.
A fleet runner's attempt owns its run by its lease, not by a claim, and the lease ends with the
attempt (``LeasedJournal.release`` is a no-op): this keeps nothing there (docs/guarantees.md).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from effectlog.adapters.protocol import Request
from effectlog.errors import CallStillRunning
from effectlog.journal.ownership import Claim


class LateCalls:
    """This runtime's timed-out calls still running, by run id; ``release`` instead of the journal's."""

    def __init__(self, release: Callable[[Claim], None]) -> None:
        self._release = release
        self._calls: dict[str, list[tuple[Request, threading.Thread]]] = {}
        self._held: dict[str, Claim] = {}  # claims kept until the run's calls end
        self._lock = threading.Lock()
        # Kept claims are given up one at a time: by the runtime's thread (its next use, its close) or by
        # the thread that saw a late call end (``_reap_after``), whichever comes first, once.
        self._reaping = threading.Lock()

    def linger(self, request: Request, thread: threading.Thread) -> None:
        """The actor's call of ``request`` timed out and its thread still runs."""
        with self._lock:
            self._calls.setdefault(request.run_id, []).append((request, thread))
        threading.Thread(target=self._reap_after, args=(thread,), name="effectlog-late-call", daemon=True).start()

    def _reap_after(self, thread: threading.Thread) -> None:
        """Once the call's thread has ended, give up what it kept: an idle runtime (an application's,
        not used again for a while) no longer keeps the run from other processes after the call ended."""
        thread.join()
        with contextlib.suppress(Exception):  # the journal's own error: the runtime's next use or close retries
            self.reap()

    def running(self, run_id: str) -> list[Request]:
        """The calls of ``run_id`` that timed out and have not ended yet."""
        with self._lock:
            calls = [c for c in self._calls.get(run_id, ()) if c[1].is_alive()]
            if calls:
                self._calls[run_id] = calls
            else:
                self._calls.pop(run_id, None)
        return [request for request, _ in calls]

    def threads(self) -> list[threading.Thread]:
        with self._lock:
            return [thread for calls in self._calls.values() for _, thread in calls if thread.is_alive()]

    def release(self, claim: Claim) -> None:
        """Give the run up, or keep its claim while a call of it still runs."""
        with self._reaping:
            if self.running(claim.run_id):
                self._held[claim.run_id] = claim
            else:
                self._release(claim)

    def reap(self) -> None:
        """Give up the kept claims whose runs' calls have all ended."""
        with self._reaping:
            for run_id, claim in list(self._held.items()):
                if not self.running(run_id):
                    del self._held[run_id]
                    self._release(claim)

    def refuse(self, run_id: str) -> None:
        """``CallStillRunning`` if a timed-out call of ``run_id`` still runs in this process."""
        self.reap()
        calls = self.running(run_id)
        if calls:
            first = calls[0]
            raise CallStillRunning(
                f"step {first.step_id!r}'s call (attempt {first.attempt}) timed out and is still running in this "
                "process, and may still make its effect: nothing about the run is decided until it ends (or this "
                "process does); nothing was written",
                run_id=run_id,
                step_id=first.step_id,
            )
