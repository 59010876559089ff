"""Durable sleep and deadlines (issue 17 item 4): the wake-up time and the deadline are in the journal.

Time is injected (a clock and a sleeper that records what it was asked to wait): no test
asserts on wall time. The crash test kills a real child process with SIGKILL during its sleep.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from effectlog import durable
from effectlog import events as ev
from effectlog.errors import DeadlinePassed, UncertainEffect
from effectlog.session import Session, SqliteCheckpointer, Toolbox, ToolboxGateway
from session_kit import ROOT

T0 = 1_800_000_000 * 10**9  # a fixed "now" (ns) for the injected clocks
S = 10**9

CHILD = """
import sys
from effectlog import durable
journal, t0 = sys.argv[1], int(sys.argv[2])
with durable.run("nap", journal=journal, clock=lambda: t0) as run:
    print("sleeping", flush=True)
    run.sleep(3600)          # the real time.sleep: this process is killed during it
    print("woke", flush=True)
"""


class Waits:
    """A sleeper that records each wait and returns at once."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)


def tags(path: Path, run_id: str) -> list[str]:
    store = SqliteCheckpointer(path)
    try:
        return [ev.tag_of(e) for e in store.load(run_id).events]
    finally:
        store.close()


def step_state(path: Path, run_id: str, step_id: str) -> str:
    store = SqliteCheckpointer(path)
    try:
        step = store.state(run_id).step(step_id)
        return step.state if step is not None else "none"
    finally:
        store.close()


@pytest.mark.crash
def test_killed_during_a_sleep_the_resume_waits_only_the_remainder(tmp_path: Path) -> None:
    """SIGKILL during a one-hour durable sleep; resumed 50 minutes later (injected clock), it waits 10 minutes."""
    db = tmp_path / "runs.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(db), str(T0)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert proc.stdout is not None
        assert "sleeping" == proc.stdout.readline().strip()
        deadline = time.monotonic() + 120
        while not (db.exists() and step_state(db, "nap", "step-0") == "sleeping"):  # the wake-up time is durable
            assert time.monotonic() < deadline, "the wake-up time was not journaled in 120 s"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        assert -signal.SIGKILL == proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert ["run.started", "step.sleeping"] == tags(db, "nap")

    waits = Waits()
    with durable.run("nap", journal=db, clock=lambda: T0 + 3000 * S, sleeper=waits) as run:
        run.sleep(3600)
    assert [600.0] == waits.asked
    assert ["run.started", "step.sleeping", "run.resumed", "step.woke", "run.completed"] == tags(db, "nap")

    again = Waits()
    with durable.run("nap", journal=db, clock=lambda: T0 + 9000 * S, sleeper=again) as run:
        run.sleep(3600)  # a completed run replays the sleep: no wait, no write
    assert [] == again.asked


def test_a_session_sleep_records_its_wake_up_time_and_a_later_pass_waits_nothing_once_past(tmp_path: Path) -> None:
    """The wake-up time is clock + seconds at the first pass; a pass after it waits nothing and records step.woke."""
    store = SqliteCheckpointer(tmp_path / "s.db")

    class Stop(Exception):
        pass

    def crash(seconds: float) -> None:
        raise Stop  # the process "ends" during the wait

    async def first() -> None:
        s = Session("r", no_tools(), store, clock=lambda: T0, sleeper=crash)
        with pytest.raises(Stop):
            await s.sleep(90, key="nap")
        s.release()

    asyncio.run(first())
    step = store.state("r").step("key:nap") or store.state("r").ordered_steps()[0]
    assert T0 + 90 * S == step.wake_at

    waits = Waits()

    async def second() -> None:
        s = Session("r", no_tools(), store, clock=lambda: T0 + 100 * S, sleeper=waits)
        await s.sleep(90, key="nap")
        s.finish("done")

    asyncio.run(second())
    assert [] == waits.asked
    assert "completed" == store.state("r").state
    store.close()


def no_tools() -> ToolboxGateway:
    """A gateway with no tools (the sleep tests call none)."""
    return ToolboxGateway(model="m", tools=Toolbox())


def counting_toolbox(calls: list[str]) -> Toolbox:
    tools = Toolbox()

    @tools.tool(idempotent=False)
    def send(to: str) -> str:
        """Counted."""
        calls.append(to)
        return f"sent to {to}"

    return tools


def test_a_step_deadline_passed_fails_the_step_by_contract_and_runs_nothing(tmp_path: Path) -> None:
    """A tool call whose deadline passed records step.expired (failed, not applied), never calls the tool,
    and answers DeadlinePassed again on a later pass; the run stays open."""
    calls: list[str] = []
    store = SqliteCheckpointer(tmp_path / "s.db")
    gw = ToolboxGateway(model="m", tools=counting_toolbox(calls))

    async def one_pass() -> str:
        s = Session("r", gw, store, clock=lambda: T0)
        try:
            with pytest.raises(DeadlinePassed) as caught:
                await s.tool("send", {"to": "bob"}, deadline=(T0 - S) / S)
            return caught.value.code
        finally:
            s.release()

    assert "deadline_passed" == asyncio.run(one_pass())
    assert "deadline_passed" == asyncio.run(one_pass())
    assert [] == calls
    state = store.state("r")
    expected = ("running", "failed", False)
    assert expected == (state.state, state.ordered_steps()[0].state, state.ordered_steps()[0].applied)
    assert 1 == [ev.tag_of(e) for e in store.load("r").events].count("step.expired")
    store.close()


def test_a_run_deadline_is_pinned_by_the_first_pass_and_fails_the_run(tmp_path: Path) -> None:
    """The first pass pins the run's deadline; a later pass (given none) past it fails the next step and the run."""
    calls: list[str] = []
    store = SqliteCheckpointer(tmp_path / "s.db")
    gw = ToolboxGateway(model="m", tools=counting_toolbox(calls))

    async def first() -> None:
        s = Session("r", gw, store, clock=lambda: T0, deadline=(T0 + 60 * S) / S)
        await s.tool("send", {"to": "a"})
        s.release()

    async def later() -> None:
        s = Session("r", gw, store, clock=lambda: T0 + 61 * S)
        await s.tool("send", {"to": "a"})  # recorded: replayed, no deadline question
        await s.tool("send", {"to": "b"})

    asyncio.run(first())
    with pytest.raises(DeadlinePassed):
        asyncio.run(later())
    with pytest.raises(DeadlinePassed):
        asyncio.run(later())  # the closed run answers with the same error
    assert ["a"] == calls
    state = store.state("r")
    assert ("failed", "run deadline passed") == (state.state, state.reason)
    store.close()


def test_a_requested_step_is_never_expired_silently(tmp_path: Path) -> None:
    """A non-idempotent step whose intent is written when the process ends stays uncertain after the deadline:
    the deadline does not turn an unknown outcome into a failure."""
    calls: list[str] = []
    store = SqliteCheckpointer(tmp_path / "s.db")
    gw = ToolboxGateway(model="m", tools=counting_toolbox(calls))

    class Died(BaseException):
        pass

    def die(point: str, sid: str) -> None:
        if point == "after_intent":
            raise Died

    async def first() -> None:
        s = Session("r", gw, store, clock=lambda: T0, crash_hook=die)
        with pytest.raises(Died):
            await s.tool("send", {"to": "a"}, deadline=(T0 + S) / S)
        s.release()

    async def later() -> None:
        s = Session("r", gw, store, clock=lambda: T0 + 5 * S)
        await s.tool("send", {"to": "a"}, deadline=(T0 + S) / S)

    asyncio.run(first())
    with pytest.raises(UncertainEffect):
        asyncio.run(later())
    assert [] == calls
    assert "uncertain" == store.state("r").ordered_steps()[0].state
    store.close()


def test_a_sleep_past_the_run_deadline_waits_until_the_deadline_then_fails_the_run(tmp_path: Path) -> None:
    """A sleep whose wake-up time lies past the run's deadline waits only until the deadline, then the run fails."""
    waits = Waits()
    late = durable.run("r", journal=tmp_path / "d.db", clock=lambda: T0, deadline=(T0 + 30 * S) / S, sleeper=waits)
    with pytest.raises(DeadlinePassed), late:
        durable.sleep(3600)
    assert [30.0] == waits.asked
    assert "failed" == SqliteCheckpointer(tmp_path / "d.db").state("r").state


BAD_TIMES: list[object] = [float("nan"), float("inf"), -float("inf"), 1e300, 10**30, "3", True]


@pytest.mark.parametrize(
    ("call", "value"),
    [(c, v) for c in ("sleep", "sleep_until", "deadline") for v in BAD_TIMES]
    + [("sleep", None), ("sleep_until", None)],  # no deadline is the default, not a bad one
)
def test_a_time_that_is_no_finite_number_of_seconds_is_bad_input_and_nothing_is_recorded(
    tmp_path: Path, call: str, value: object
) -> None:
    """``sleep(nan)`` raised ValueError, ``sleep(inf)``/``sleep(1e300)`` OverflowError, and ``sleep("3")``
    built a string of a billion characters (``"3" * NS``) before failing; a deadline of NaN likewise.
    Proves: each is BadInput naming the argument, before anything is recorded (the run has no event)."""
    from effectlog.errors import BadInput, UnknownRun

    journal = str(tmp_path / "j.db")

    def use() -> None:
        if call == "deadline":
            with durable.run("r", journal=journal, deadline=value):  # type: ignore[arg-type]
                pass
        else:
            with durable.run("r", journal=journal, sleeper=Waits()) as run:
                getattr(run, call)(value)

    with pytest.raises(BadInput, match=r"seconds|deadline|time"):
        use()
    try:
        recorded = [t for t in tags(Path(journal), "r") if t.startswith("step.")]
    except UnknownRun:
        recorded = []  # refused before the run began
    assert [] == recorded
