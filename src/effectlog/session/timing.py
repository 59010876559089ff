"""Durable sleep and deadlines for a session: the wake-up time and the deadline are in the journal.

A sleep is a step: ``step.sleeping`` records its wake-up time before the process waits,
``step.woke`` after. A pass that finds a step sleeping (the process died during the
sleep) waits only what is left until the recorded time: the wake-up time never moves.

A deadline (for one step, or for the whole run, pinned by ``run.started``) is checked
when a step is about to begin, before its intent is written: past it, the step records
``step.expired`` (failed, definitely not applied) and ``DeadlinePassed`` is raised; past a
run deadline the run fails too. A step whose intent is already written is never expired:
its outcome may be unknown, and a deadline does not decide that (it settles as any
step does: the same key again, or uncertain and reconciled). A call in progress is not
interrupted by a deadline.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from effectlog import events as ev
from effectlog.errors import BadInput, DeadlinePassed, RunFailed
from effectlog.fold import StepState
from effectlog.recovery import Action, decide
from effectlog.session import identity as ids

if TYPE_CHECKING:
    from effectlog.session.durable import Session

Sleeper = Callable[[float], Awaitable[None] | None]  # seconds -> waits (asyncio.sleep, time.sleep, a test's)

NS = 1_000_000_000
SLEEP: Final = "sleep"


# Times are recorded as integer ns in the journal's 64-bit columns; a sleep's wake-up time is now plus
# its seconds, so either part keeps to 2**62 ns (about 146 years) and their sum fits.
_MAX_NS = 2**62


def seconds_ns(value: Any, what: str) -> int:
    """``value`` seconds as integer ns, or ``BadInput`` naming ``what``: an int or float (not a bool, not
    a str: ``"3" * NS`` is a billion characters), finite, within about 146 years of zero."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadInput(f"{what} must be a number of seconds, not {type(value).__name__} {value!r:.40}")
    if isinstance(value, float) and not math.isfinite(value):
        raise BadInput(f"{what}: {value!r} is not a finite number of seconds")
    if not -_MAX_NS // NS <= value <= _MAX_NS // NS:
        raise BadInput(f"{what}: {value!r} seconds is out of range (at most {_MAX_NS // NS} seconds)")
    return int(value * NS) if isinstance(value, float) else value * NS


def to_ns(t: float | None, what: str = "deadline") -> int | None:
    """A POSIX time in seconds (as ``time.time()`` gives) as ns since the epoch."""
    return None if t is None else seconds_ns(t, what)


def run_deadline(session: Session) -> int | None:
    """The run's deadline: the one pinned by ``run.started``, or this pass's, whichever is earlier."""
    found = [d for d in (session.state.deadline, session.deadline_ns) if d is not None]
    return min(found) if found else None


def raise_if_expired(session: Session, step: StepState) -> None:
    """A step recorded as expired answers the same way on every later pass."""
    if step.expired:
        raise DeadlinePassed(step.reason, run_id=session.run_id, step_id=step.step_id)


def expire_if_late(session: Session, sid: str, *, kind: ids.StepKind, name: str, fp: str, deadline: int | None) -> None:
    """Before a step begins: past its deadline or the run's, record it expired and raise ``DeadlinePassed``."""
    now = session.clock()
    run_dl = run_deadline(session)
    if run_dl is not None and now >= run_dl:
        passed, scope = run_dl, "run"
    elif deadline is not None and now >= deadline:
        passed, scope = deadline, "step"
    else:
        return
    expire(session, sid, kind=kind, name=name, fp=fp, passed=passed, scope=scope)


def expire(session: Session, sid: str, *, kind: ids.StepKind, name: str, fp: str, passed: int, scope: str) -> None:
    """Record the step expired (and the run failed, for the run's deadline); raise ``DeadlinePassed``."""
    now = session.clock()
    step = session.state.step(sid)
    specs: list[tuple[type[ev.Event], dict[str, object]]] = [
        (
            ev.StepExpired,
            {
                "step_id": sid,
                "attempt": step.attempt if step is not None else 1,
                "deadline": passed,
                "scope": scope,
                "adapter": name,
                "kind": kind,
                "fingerprint": fp,
            },
        )
    ]
    if scope == "run":
        specs.append((ev.RunFailed, {"step_id": sid, "reason": "run deadline passed"}))
    session._record(*specs, ts=now)
    raise DeadlinePassed(
        f"the {scope} deadline passed before {kind} step {name!r} began; it failed, nothing ran",
        run_id=session.run_id,
        step_id=sid,
        deadline=passed,
    )


async def sleep_step(session: Session, wake_at: Callable[[], int], key: str | None, sleeper: Sleeper) -> None:
    """One durable sleep: record the wake-up time (once), wait the remainder, record the wake-up."""
    replaying = session.replay_closed and session.completed  # a durable block run again after it completed
    if not replaying:
        session._check_open("a sleep")
    sid = session._next_id(key, "a sleep")
    fp = ids.fingerprint(SLEEP, SLEEP, None)
    step = session.state.step(sid)
    if step is not None:
        session._check_same(step, SLEEP, SLEEP, fp)
        raise_if_expired(session, step)
    action = decide(step)
    if action is Action.SKIP:
        return
    if replaying:
        session._check_open("a sleep")  # a sleep the completed run never finished: RunClosed
    if action is Action.EXECUTE:
        expire_if_late(session, sid, kind=SLEEP, name=SLEEP, fp=fp, deadline=None)
        session._record(
            (
                ev.StepSleeping,
                {"step_id": sid, "attempt": step.attempt if step else 1, "wake_at": wake_at(), "fingerprint": fp},
            )
        )
        session._crash_point("after_intent", sid)
    elif action is not Action.WAIT_UNTIL:
        assert step is not None
        raise RunFailed(f"the sleep step is {step.state}", run_id=session.run_id, step_id=sid)
    step = session.state.step(sid)
    assert step is not None
    assert step.wake_at is not None
    run_dl = run_deadline(session)
    until = step.wake_at if run_dl is None else min(step.wake_at, run_dl)
    remaining = (until - session.clock()) / NS
    if remaining > 0:
        waiting = sleeper(remaining)
        if inspect.isawaitable(waiting):
            await waiting
    if run_dl is not None and run_dl < step.wake_at:  # the run's deadline came first: it fails
        expire(session, sid, kind=SLEEP, name=SLEEP, fp=fp, passed=run_dl, scope="run")
    session._record((ev.StepWoke, {"step_id": sid, "attempt": step.attempt}))
