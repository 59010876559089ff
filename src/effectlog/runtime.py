"""The runtime: runs plans durably against one journal; each run is an actor.

Many run actors in one process share one journal-writer actor (group commit).
``Runtime.run`` is the synchronous facade the CLI uses; ``arun``/``arun_many`` are
the asynchronous entry points. Operator actions (approve, deny, reconcile) only
append events.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from effectlog import events as ev
from effectlog import loopfork
from effectlog.actor import RunActor
from effectlog.adapters.registry import AdapterContext, Factory, Registry
from effectlog.fold import RunState
from effectlog.journal import Journal, filelocks, load_run, open_journal, sidecars
from effectlog.latecalls import LateCalls
from effectlog.outcome import (
    CrashHook,
    Decision,
    Policy,
    PolicyRequest,
    RunOutcome,
    SimulatedCrash,
    StepSummary,
    outcome_of,
    reconcile_hint,
)
from effectlog.plan import Plan, parse_plan, read_plan_bytes
from effectlog.recorder import Clock
from effectlog.trace import Trace

if TYPE_CHECKING:
    from effectlog.fleet.secrets import Provider
    from effectlog.lifecycle import ForkRecord, PendingRun, Recovered, Repinned

_T = TypeVar("_T")

__all__ = [
    "CrashHook",
    "Decision",
    "Policy",
    "PolicyRequest",
    "ReusedLoop",
    "RunActor",
    "RunOutcome",
    "Runtime",
    "SimulatedCrash",
    "StepSummary",
    "outcome_of",
    "reconcile_hint",
]


def _read_plan(path: str | Path) -> Plan:
    """The plan file at ``path``; ``FileInUse`` for a journal or store this process has open.

    Read under ``no_opens`` (a read of at most ``MAX_PLAN_BYTES`` of a regular file): given the journal's
    path, the plan reader opened and closed a descriptor of the journal file, which dropped this process's
    SQLite locks on it, before saying it is no plan; the runtime then went on with no lock on its journal.
    """
    with filelocks.no_opens():
        filelocks.refuse_open_here(os.fspath(path), "plan")
        data = read_plan_bytes(path)
    return parse_plan(data, str(path))


def _open_trace(path: str | os.PathLike[str], key: bytes | None) -> Trace:
    """The trace at ``path``; ``FileInUse`` for a journal or store this process has open (its last line
    was read through a descriptor whose close dropped SQLite's locks, and records were appended into the
    database file). Opened under ``no_opens``: no SQLite of this process opens the file meanwhile."""
    with filelocks.no_opens():
        filelocks.refuse_open_here(os.fspath(path), "trace")
        return Trace(path, key=key)


class Runtime:
    """Runs plans durably against one journal; each run is owned by its actor while it is driven."""

    def __init__(
        self,
        journal: str | os.PathLike[str] | Journal,
        *,
        adapters: Registry | Mapping[str, Factory] | None = None,
        effects: str | os.PathLike[str] | None = None,
        policy: Policy | None = None,
        clock: Clock | None = None,
        trace: str | os.PathLike[str] | None = None,
        crash_hook: CrashHook | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], Any] | None = None,
    ) -> None:
        if trace is not None:  # by its text, before the journal is made
            sidecars.refuse_ambiguous(os.fspath(trace), "trace")
        # One file as two of these (``effects`` the journal's file, a trace in its WAL): refused before the
        # journal is made, as the CLI does (the effect store found the journal's tables only after).
        where = os.fspath(journal) if isinstance(journal, str | os.PathLike) else journal.location
        files = (("journal", where, True), ("effects", effects, True), ("trace", trace, False))
        sidecars.refuse_shared([(name, os.fspath(f) if f is not None else None, db) for name, f, db in files])
        self.journal: Journal = open_journal(os.fspath(journal)) if isinstance(journal, str | os.PathLike) else journal
        self.registry = adapters if isinstance(adapters, Registry) else Registry(adapters)
        self.context = AdapterContext(effects=os.fspath(effects) if effects is not None else None)
        self.policy = policy
        self.clock: Clock = clock or time.time_ns
        self.trace = _open_trace(trace, self.journal.chain.key) if trace is not None else None  # chained as the journal
        self.crash_hook = crash_hook
        self.rng = rng or random.Random()
        self.sleep = sleep or asyncio.sleep
        self.stop_signal: int | None = None  # set by request_stop; every run stops before its next step
        # Backoffs waiting now (wait_or_stop), each woken by request_stop: (its loop, its future).
        self._stop_waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()
        from effectlog.writer import JournalWriter

        self.writer = JournalWriter(self.journal)
        self.calls = LateCalls(self.journal.release)  # timed-out calls still running, and their runs' claims
        if crash_hook is not None and hasattr(self.journal, "before_commit"):
            self.journal.before_commit = lambda events: crash_hook(
                f"before_commit:{ev.tag_of(events[0])}", getattr(events[0], "step_id", "")
            )

    # -- running --------------------------------------------------------------------

    def run(self, plan: Plan | str | Path, *, on: ReusedLoop | None = None) -> RunOutcome:
        """``arun`` from synchronous code: on a new event loop, or on ``on`` (a thread's loop, reused)."""
        work = self.arun(plan)
        return on.run(work) if on is not None else _run_sync(work)

    async def arun(self, plan: Plan | str | Path) -> RunOutcome:
        if not isinstance(plan, Plan):
            plan = _read_plan(plan)
        # One owner per run: claimed before its state is read, so nobody else writes it while
        # this actor drives it (RunOwned, exit 6, for a second actor here or anywhere else).
        self.calls.refuse(plan.run_id)
        claim = self.journal.claim(plan.run_id, "run")
        try:
            actor = RunActor(self, plan)
            self.writer.active_runs += 1
            try:
                # Let runs started together (arun_many) all register before any writes, so their
                # batches queue for shared commits instead of the first running alone, inline.
                await asyncio.sleep(0)
                return await actor.drive()
            finally:
                self.writer.active_runs -= 1
        finally:
            self.calls.release(claim)  # kept while a timed-out call of the run still runs (latecalls)

    async def arun_many(self, plans: Iterable[Plan]) -> list[RunOutcome]:
        return list(await asyncio.gather(*(self.arun(p) for p in plans)))

    def request_stop(self, signum: int) -> None:
        """Stop every run before its next step, so after the current step's durable commit (SIGINT/SIGTERM).

        A run waiting out a retry's backoff (nothing in flight) stops at once. Safe from a signal
        handler or another thread: the waiting loops are woken through ``call_soon_threadsafe``.
        """
        self.stop_signal = signum
        for loop, stopped in list(self._stop_waiters):
            with contextlib.suppress(RuntimeError):  # a loop closed meanwhile: nothing waits on it
                loop.call_soon_threadsafe(_settle, stopped)

    async def wait_or_stop(self, delay: float) -> bool:
        """Sleep ``delay`` seconds (through the runtime's ``sleep``), less if a stop is requested
        meanwhile; whether a stop was requested."""
        if self.stop_signal is None:
            loop = asyncio.get_running_loop()
            waiter = (loop, loop.create_future())
            self._stop_waiters.add(waiter)
            sleeping = asyncio.ensure_future(self.sleep(delay))
            try:
                if self.stop_signal is None:  # a request between the look above and the registration
                    await asyncio.wait((sleeping, waiter[1]), return_when=asyncio.FIRST_COMPLETED)
            finally:
                self._stop_waiters.discard(waiter)
                sleeping.cancel()
                waiter[1].cancel()
        return self.stop_signal is not None

    def load(self, run_id: str) -> RunState:
        """The run's state (its timeline is in ``ordered_steps()``), replayed and verified."""
        return load_run(self.journal, run_id)

    # -- the life of a run after things go wrong (docs/lifecycle.md) -----------------------

    def pending(self, kind: str | None = None) -> list[PendingRun]:
        """Open runs nobody drives (of ``kind``, "plan" or "session", when given): what an application re-drives."""
        from effectlog.lifecycle import pending

        return [p for p in pending(self.journal) if kind is None or p.kind == kind]

    def recover(self, *, plans: Mapping[str, Plan] | None = None, secrets: Provider | None = None) -> list[Recovered]:
        """Drive every interrupted plan run nobody drives, from its pinned plan; one report per open run."""
        return _run_sync(self.arecover(plans=plans, secrets=secrets))

    async def arecover(
        self, *, plans: Mapping[str, Plan] | None = None, secrets: Provider | None = None
    ) -> list[Recovered]:
        from effectlog.lifecycle import arecover

        return await arecover(self, plans=plans, secrets=secrets)

    def fork(
        self,
        run_id: str,
        new_run_id: str,
        *,
        by: str,
        reason: str,
        from_step: str | None = None,
        plan: Plan | None = None,
        secrets: Provider | None = None,
    ) -> RunOutcome:
        """A new run carrying ``run_id``'s results before ``from_step`` (default: its first unfinished step)."""
        self.calls.refuse(run_id)
        from effectlog.lifecycle import afork

        return _run_sync(
            afork(self, run_id, new_run_id, by=by, reason=reason, from_step=from_step, plan=plan, secrets=secrets)
        )

    def retry(
        self,
        run_id: str,
        *,
        by: str,
        reason: str,
        new_run_id: str | None = None,
        plan: Plan | None = None,
        secrets: Provider | None = None,
    ) -> RunOutcome:
        """Fork ``run_id`` from its first unfinished step (the one it failed on) as ``R.retryN``; once per run."""
        self.calls.refuse(run_id)
        from effectlog.lifecycle import afork
        from effectlog.lifecycle.fork import retry_run_id, retry_turn

        # The "once" check and the fork's first commit are one turn: two retries racing both passed the
        # check before either fork existed, and both ran the remaining steps under new keys. A fork holds
        # the same turn from its checks to its first commit (``fork_turn``): one written between this
        # check and this retry's fork went unseen, and both made the remaining steps.
        with retry_turn(self.journal, run_id):
            child = retry_run_id(self.journal, run_id)
            child = new_run_id or child
            return _run_sync(
                afork(self, run_id, child, by=by, reason=reason, plan=plan, secrets=secrets, turn_held=True)
            )

    def forks(self, run_id: str) -> list[ForkRecord]:
        """The runs forked from ``run_id`` (each child's run.started names its parent)."""
        from effectlog.lifecycle import forks_of

        return forks_of(self.journal, run_id)

    def repin(self, run_id: str, *, by: str, reason: str, plan: Plan | None = None) -> Repinned:
        """Accept the current adapter implementations for an open run (appends run.repinned)."""
        self.calls.refuse(run_id)
        from effectlog.lifecycle import repin

        return repin(
            self.journal,
            run_id,
            self.registry,
            self.context,
            by=by,
            reason=reason,
            plan=plan,
            clock=self.clock,
            trace=self.trace,
        )

    # -- operators (they only append) ---------------------------------------------------

    def approve(
        self,
        run_id: str,
        step_id: str,
        *,
        by: str,
        reason: str = "",
        expires_at: int | None = None,
        expect_digest: str | None = None,
    ) -> RunState:
        self.calls.refuse(run_id)
        from effectlog.approvals import approve

        return approve(
            self.journal,
            run_id,
            step_id,
            by=by,
            reason=reason,
            expires_at=expires_at,
            expect_digest=expect_digest,
            clock=self.clock,
            trace=self.trace,
        )

    def deny(self, run_id: str, step_id: str, *, by: str, reason: str = "") -> RunState:
        self.calls.refuse(run_id)
        from effectlog.approvals import deny

        return deny(self.journal, run_id, step_id, by=by, reason=reason, clock=self.clock, trace=self.trace)

    def reconcile(
        self, run_id: str, step_id: str, *, outcome: Literal["applied", "not_applied"], evidence: str, operator: str
    ) -> RunState:
        self.calls.refuse(run_id)
        from effectlog.reconcile import reconcile

        return reconcile(
            self.journal,
            run_id,
            step_id,
            outcome=outcome,
            evidence=evidence,
            operator=operator,
            clock=self.clock,
            trace=self.trace,
        )

    def reconcile_from_ledger(self, run_id: str, step_id: str, effects: str | None = None) -> RunState:
        """Ask the run's own effect store (the one ``run.started`` pinned), opened read-only."""
        self.calls.refuse(run_id)
        from effectlog.errors import BadInput
        from effectlog.reconcile import reconcile_from_ledger

        path = effects or self.context.effects
        if path is None:
            raise BadInput("reconcile_from_ledger: give the effect store (effects=...)", run_id=run_id)
        return reconcile_from_ledger(self.journal, run_id, step_id, path, clock=self.clock, trace=self.trace)

    def reconcile_by_lookup(
        self, run_id: str, step_id: str, *, effects: str | None = None, plan: Plan | None = None
    ) -> RunState:
        """Ask the step's own adapter (built as the run pinned it) with the recorded request.

        ``plan`` supplies secret args' real values (the journal holds digests); ``lookup``
        answering ``None`` raises ``LookupUndecided`` and the step stays uncertain.
        """
        self.calls.refuse(run_id)
        from effectlog.reconcile import reconcile_by_lookup

        return reconcile_by_lookup(
            self.journal,
            run_id,
            step_id,
            self.registry,
            effects=effects or self.context.effects,
            plan=plan,
            clock=self.clock,
            trace=self.trace,
        )

    def close(self) -> None:
        """Close the journal, the effect store and the trace; while a timed-out call still runs, a
        background thread does it once every such call has ended (the runs' claims and the store it
        may still write stay open until then; the process's exit ends both)."""
        self.calls.reap()
        late = self.calls.threads()
        if late:
            threading.Thread(target=self._close_after, args=(late,), name="effectlog-late-close", daemon=True).start()
            return
        self._close_now()

    def _close_after(self, late: list[threading.Thread]) -> None:
        for thread in late:
            thread.join()
        self.calls.reap()
        self._close_now()

    def _close_now(self) -> None:
        self.context.close()
        if self.trace is not None:
            self.trace.close()
        self.journal.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _run_sync(work: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run(work)``, with the answer kept off the task.

    When SIGINT has Python's default handler, ``asyncio.run`` installs its own around the task
    and, restoring it, ``signal.getsignal`` and ``signal.signal`` each build an enum's error
    message from ``repr`` of that handler, which holds the finished task, whose ``repr`` holds
    its result: a 33k-step outcome was rendered twice (~30 ms). The task returns ``None`` instead.
    """
    box: list[_T] = []

    async def keep() -> None:
        loopfork.track(asyncio.get_running_loop())
        box.append(await work)

    asyncio.run(keep())
    return box[0]


class ReusedLoop:
    """One event loop for one thread's runs, one after another (a fleet runner's attempts).

    ``asyncio.run`` builds a loop and closes it for every call (~120 µs of CPU, a fleet
    run's whole runtime costs about 1.5 ms). This keeps one, and keeps what ``asyncio.run``
    promises a call: each ``run`` is a task of its own with a fresh copy of the thread's
    context (context variables set by one run are not seen by the next), and nothing a run
    left behind outlives it: its leftover tasks are cancelled and awaited before ``run``
    returns. A run that ends with an exception closes the loop, as ``asyncio.run`` would,
    and the next run gets a new one: a loop that saw a failure is not trusted again.
    Not thread-safe: one thread calls ``run`` and ``close``.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self.loops = 0  # loops built so far (tests)

    def run(self, work: Coroutine[Any, Any, _T]) -> _T:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.new_event_loop()
            loopfork.track(loop)
            self.loops += 1
        ended = False
        try:
            task = loop.create_task(work)
            try:
                answer = loop.run_until_complete(task)
            finally:
                _cancel_leftovers(loop)
            ended = True
            return answer
        finally:
            if not ended:
                self.close()

    def close(self) -> None:
        """What ``asyncio.run`` does at its end: cancel what is left, close async generators, the executor, the loop."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            _cancel_leftovers(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel every task still pending on ``loop`` (not running) and wait until each has ended."""
    left = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if not left:
        return
    for task in left:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
