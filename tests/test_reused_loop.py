"""One event loop for a thread's runs (``effectlog.runtime.ReusedLoop``, a fleet runner's attempts).

A reused loop must not carry anything of one run into the next: each run is its own task
with its own copy of the context, what a run left pending is cancelled before ``run``
returns, a run that failed closes the loop (the next gets a new one), and runs of
different plans on one loop, one after another was interrupted, each invoke their own
steps exactly once. The runner test drives a real runner over a real SQLite store, whose
attempts follow one another on one thread (each claimed in the transaction that ended the
last) and so on one loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from effectlog.adapters import Receipt, Request
from effectlog.errors import ExitStatus
from effectlog.fleet import open_store
from effectlog.fleet.runner import Runner, RunnerConfig
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import ReusedLoop, Runtime

WHO: contextvars.ContextVar[str] = contextvars.ContextVar("WHO", default="nobody")


class Interrupted(BaseException):
    """Deliberate control flow out of a run (as the runner's ``CancelObserved`` and ``LeaseLost`` are)."""


class Counting:
    """A non-blocking tool (called inline, on the loop's thread) that notes each call and the loop it ran on."""

    blocking = False

    def __init__(self, calls: Counter[tuple[str, str]], loops: set[int], threads: set[int]) -> None:
        self.calls, self.loops, self.threads = calls, loops, threads

    def invoke(self, request: Request) -> Receipt:
        self.calls[(request.run_id, request.step_id)] += 1
        self.loops.add(id(asyncio.get_running_loop()))
        self.threads.add(threading.get_ident())
        return Receipt(data={"ok": True})


def plan_of(run_id: str, *step_ids: str) -> Plan:
    return Plan(
        run_id=run_id,
        adapters={"count": AdapterDecl(type="count", idempotent=True)},
        steps=tuple(StepDecl(id=sid, adapter="count", args={"run": run_id}) for sid in step_ids),
    )


def test_each_run_is_its_own_task_with_its_own_context_and_what_it_left_pending_is_cancelled() -> None:
    """The first run sets a context variable and leaves a task sleeping for ever; the second run, on the
    same loop, sees the variable unset, and the leftover task was cancelled before the first ``run`` returned."""
    loop = ReusedLoop()
    ended: list[str] = []

    async def linger() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    async def first() -> int:
        WHO.set("first")
        asyncio.get_running_loop().create_task(linger())
        await asyncio.sleep(0)
        return id(asyncio.get_running_loop())

    async def second() -> tuple[str, int, int]:
        return WHO.get(), id(asyncio.get_running_loop()), len(asyncio.all_tasks())

    try:
        first_loop = loop.run(first())
        assert ["cancelled"] == ended
        assert ("nobody", first_loop, 1) == loop.run(second())
        assert "nobody" == WHO.get()
        assert 1 == loop.loops
    finally:
        loop.close()


@pytest.mark.parametrize("error", [ValueError("tool bug"), Interrupted()])
def test_a_run_that_fails_closes_its_loop_and_the_next_run_gets_a_new_one(error: BaseException) -> None:
    """An exception or deliberate control flow out of a run propagates unchanged, the loop it ran on is
    closed, and the next run works on a new loop."""
    loop = ReusedLoop()
    seen: list[asyncio.AbstractEventLoop] = []

    async def failing() -> None:
        seen.append(asyncio.get_running_loop())
        raise error

    async def fine() -> str:
        seen.append(asyncio.get_running_loop())
        return "done"

    try:
        with pytest.raises(type(error)):
            loop.run(failing())
        assert seen[0].is_closed()
        assert "done" == loop.run(fine())
        assert (2, False) == (loop.loops, seen[1].is_closed())
    finally:
        loop.close()
    assert seen[1].is_closed()


def test_runs_of_different_plans_on_one_loop_each_invoke_their_own_steps_once_after_one_was_interrupted(
    tmp_path: Path,
) -> None:
    """On one reused loop and one SQLite journal: run A is interrupted after its first step's commit, run B
    (another plan) then runs to the end, then A resumes. Every step of each plan was invoked exactly once,
    and by its own run: nothing of A ran during B, nothing of B again during A."""
    calls: Counter[tuple[str, str]] = Counter()
    loops: set[int] = set()
    interrupt = ["a1"]

    def hook(point: str, step_id: str) -> None:
        if point == "after_confirm" and step_id in interrupt:
            interrupt.remove(step_id)
            raise Interrupted

    def factory(decl: AdapterDecl, ctx: Any) -> Counting:
        return Counting(calls, loops, set())

    loop = ReusedLoop()
    runtime = Runtime(tmp_path / "journal.db", adapters={"count": factory}, crash_hook=hook)
    try:
        with pytest.raises(Interrupted):
            runtime.run(plan_of("A", "a1", "a2"), on=loop)
        assert Counter({("A", "a1"): 1}) == calls
        done_b = runtime.run(plan_of("B", "b1", "b2"), on=loop)
        assert Counter({("A", "a1"): 1, ("B", "b1"): 1, ("B", "b2"): 1}) == calls
        done_a = runtime.run(plan_of("A", "a1", "a2"), on=loop)
    finally:
        loop.close()
        runtime.close()
    assert (ExitStatus.DONE, ExitStatus.DONE) == (done_b.exit_status, done_a.exit_status)
    assert Counter({("A", "a1"): 1, ("A", "a2"): 1, ("B", "b1"): 1, ("B", "b2"): 1}) == calls
    assert 2 == len(loops)  # the interrupted run's loop was closed; B and A's resumption shared the next


def test_a_runner_runs_attempts_of_different_plans_one_after_another_on_one_thread_and_one_loop(
    tmp_path: Path,
) -> None:
    """A capacity-1 runner drains five queued requests of different plans: each request succeeded, each of
    its own steps was invoked exactly once, and the attempts (each claimed in the transaction that ended
    the one before) ran on one thread and one event loop."""
    path = str(tmp_path / "fleet.db")
    calls: Counter[tuple[str, str]] = Counter()
    loops: set[int] = set()
    threads: set[int] = set()
    plans = [plan_of(f"run-{i}", *(f"s{i}-{j}" for j in range(i + 1))) for i in range(5)]
    with open_store(path) as store:
        for i, plan in enumerate(plans):
            store.submit("reuse", f"k{i}", plan)
        runner = Runner(
            RunnerConfig(store=path, runner_id="reuser", exit_when_idle=True, recover=False), store, log=io.StringIO()
        )
        runner.registry.factories["count"] = lambda decl, ctx: Counting(calls, loops, threads)
        assert 0 == runner.serve()
        states = [r.state for r in store.requests()]
    expected = Counter({(p.run_id, s.id): 1 for p in plans for s in p.steps})
    assert (["succeeded"] * 5, expected) == (states, calls)
    assert (1, 1) == (len(threads), len(loops))
