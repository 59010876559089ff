"""Group commit: concurrent runs in one process share durable commits, and each run's
write-ahead is still durable before its tool runs (and its result before it advances)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import journal_tamper
from effectlog import events as ev
from effectlog.adapters.protocol import Receipt, Request
from effectlog.errors import SequenceGap
from effectlog.fold import Record
from effectlog.journal import SqliteJournal
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import Runtime, SimulatedCrash
from effectlog.testing import sample_run
from effectlog.writer import JournalWriter

RUNS, STEPS = 8, 4


def plans(adapter_type: str = "noop") -> list[Plan]:
    return [
        Plan(
            run_id=f"group-{i}",
            adapters={"tool": AdapterDecl(type=adapter_type, idempotent=True)},
            steps=tuple(StepDecl(id=f"s{j}", adapter="tool") for j in range(STEPS)),
        )
        for i in range(RUNS)
    ]


def record_commits(journal: SqliteJournal) -> list[set[str]]:
    """Wrap the journal so each commit notes which runs it carried. Every SQLite append, inline
    (a lone run) or grouped, goes through ``append_checkpointed``: each commit is noted once."""
    commits: list[set[str]] = []
    append_checkpointed = journal.append_checkpointed

    def counted(
        events: Sequence[ev.Event], seals: Sequence[tuple[str, int, bytes]], checkpoints: Sequence[Any]
    ) -> list[Record]:
        commits.append({e.run_id for e in events})
        return append_checkpointed(events, seals, checkpoints)

    journal.append_checkpointed = counted  # type: ignore[method-assign]
    return commits


def test_concurrent_runs_share_commits(tmp_path: Path) -> None:
    """Eight runs started together commit together: some commit carries all eight runs, and
    there are far fewer commits than batches (one per run per durable point without grouping)."""
    batches_per_run = 1 + 2 * STEPS + 1  # started; requested, effected+confirmed per step; completed
    with Runtime(tmp_path / "j.db") as rt:
        commits = record_commits(rt.journal)  # type: ignore[arg-type]
        outcomes = asyncio.run(rt.arun_many(plans()))
    assert ["completed"] * RUNS == [o.state for o in outcomes]
    assert RUNS == max(len(runs) for runs in commits)
    assert len(commits) * 4 <= RUNS * batches_per_run


class Witness:
    """A tool that, when called, looks at the journal through its own connection: a row it can
    see there is committed, and with ``synchronous=FULL`` a committed row is durable."""

    blocking = False  # called inline on the event loop, while other groups may be committing

    def __init__(self, path: Path, seen: list[str]) -> None:
        self.db = journal_tamper.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        self.seen = seen

    def committed(self, run_id: str, step_id: str) -> set[str]:
        rows = self.db.execute("SELECT phase FROM ev WHERE run_id = ? AND step_id = ?", (run_id, step_id))
        return {phase for (phase,) in rows}

    def invoke(self, request: Request) -> Receipt:
        if "step.requested" not in self.committed(request.run_id, request.step_id):
            self.seen.append(f"{request.run_id}/{request.step_id}: called before its request was durable")
        index = int(request.step_id[1:])
        if index and "step.confirmed" not in self.committed(request.run_id, f"s{index - 1}"):
            self.seen.append(f"{request.run_id}/{request.step_id}: called before s{index - 1} was confirmed")
        return Receipt(data={"ok": True})


def test_each_write_ahead_is_durable_before_its_tool_runs_while_commits_are_shared(tmp_path: Path) -> None:
    """With commits shared across eight runs, every tool call finds its own ``step.requested``
    and the previous step's ``step.confirmed`` already committed (hence durable)."""
    path = tmp_path / "j.db"
    problems: list[str] = []
    with Runtime(path, adapters={"witness": lambda decl, ctx: Witness(path, problems)}) as rt:
        commits = record_commits(rt.journal)  # type: ignore[arg-type]
        outcomes = asyncio.run(rt.arun_many(plans("witness")))
    assert [] == problems
    assert [STEPS] * RUNS == [o.adapter_calls for o in outcomes]
    assert max(len(runs) for runs in commits) > 1  # the property held while commits were shared


def test_a_bad_batch_in_a_shared_commit_fails_alone(tmp_path: Path) -> None:
    """One run's bad batch makes the shared commit fail; the writer then commits each batch
    alone, so the good runs are stored and only the bad one gets the error."""
    with SqliteJournal(tmp_path / "j.db") as journal:
        writer = JournalWriter(journal)
        writer.active_runs = 3  # three runs are active: batches queue for a shared commit

        async def three() -> list[Any]:
            good_a, bad, good_b = sample_run("a", 1), sample_run("c", 1)[1:2], sample_run("b", 1)
            return await asyncio.gather(
                writer.append(good_a), writer.append(bad), writer.append(good_b), return_exceptions=True
            )

        a, c, b = asyncio.run(three())
        assert isinstance(c, SequenceGap)
        assert [len(sample_run("a", 1))] * 2 == [len(a), len(b)]
        assert ["a", "b"] == journal.runs()


def test_a_crash_inside_a_shared_commit_reaches_every_run_in_it(tmp_path: Path) -> None:
    """A crash during a shared commit is a crash for every run in the group: each run stops
    with it, none is told its batch is durable, and nothing of the group is stored."""
    with Runtime(tmp_path / "j.db") as rt:

        def crash(events: Sequence[ev.Event]) -> None:
            if len({e.run_id for e in events}) > 1:
                raise SimulatedCrash("before_commit")

        rt.journal.before_commit = crash  # type: ignore[attr-defined]

        async def all_runs() -> list[Any]:
            return await asyncio.gather(*(rt.arun(p) for p in plans()), return_exceptions=True)

        results = asyncio.run(all_runs())
        assert [SimulatedCrash] * RUNS == [type(r) for r in results]
        assert [] == rt.journal.runs()


@pytest.mark.parametrize(("active", "on_loop_thread"), [(2, True), (3, False)])
def test_a_shared_commit_runs_inline_only_when_every_active_run_waits_for_it(
    tmp_path: Path, active: int, on_loop_thread: bool
) -> None:
    """Two batches share a commit. With two active runs, both wait for it, so it runs on the event
    loop's thread (no hop to a worker); with a third run active elsewhere (say, its tool on a thread)
    it runs on a worker thread, so the loop stays free for that run. Both store both batches."""
    threads: list[int] = []
    with SqliteJournal(tmp_path / "j.db") as journal:
        journal.before_commit = lambda events: threads.append(threading.get_ident())
        writer = JournalWriter(journal)
        writer.active_runs = active

        async def two() -> list[list[Record]]:
            return list(await asyncio.gather(writer.append(sample_run("a", 1)), writer.append(sample_run("b", 1))))

        a, b = asyncio.run(two())
        assert [len(sample_run("a", 1))] * 2 == [len(a), len(b)]
        assert ["a", "b"] == journal.runs()
    assert [on_loop_thread] == [t == threading.get_ident() for t in threads]  # one commit for both


def test_concurrent_runs_with_nothing_else_to_do_commit_on_the_loop_thread(tmp_path: Path) -> None:
    """Eight no-op runs: every commit they share carries a batch of every active run, so each runs
    inline on the event loop's thread, and the runs complete every step."""
    shared: list[bool] = []
    with Runtime(tmp_path / "j.db") as rt:

        def note(events: Sequence[ev.Event]) -> None:
            if len({e.run_id for e in events}) > 1:
                shared.append(threading.get_ident() == main)

        main = threading.get_ident()
        rt.journal.before_commit = note  # type: ignore[attr-defined]
        outcomes = asyncio.run(rt.arun_many(plans()))
    assert ["completed"] * RUNS == [o.state for o in outcomes]
    assert shared
    assert [True] * len(shared) == shared


@pytest.mark.parametrize("runs", [1, 2])
def test_few_runs_still_complete_with_grouping(tmp_path: Path, runs: int) -> None:
    """With one run the writer appends inline; with two it groups; both complete every step."""
    with Runtime(tmp_path / "j.db") as rt:
        outcomes = asyncio.run(rt.arun_many(plans()[:runs]))
        assert ["completed"] * runs == [o.state for o in outcomes]
        assert [STEPS] * runs == [len(o.steps) for o in outcomes]


class NotingJournal(SqliteJournal):
    """A journal subclass that does something in ``append`` (here: notes each batch's event types)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.noted: list[list[str]] = []

    def append(self, events: Sequence[ev.Event]) -> list[Record]:
        self.noted.append([type(e).__name__ for e in events])
        return super().append(events)


def test_a_journal_whose_append_does_more_is_called_through_it_for_a_lone_run(tmp_path: Path) -> None:
    """The writer's direct path to ``append_checkpointed`` (a lone run, two frames fewer) is taken only
    for SQLite's and PostgreSQL's own ``append``: a subclass that overrides it sees every batch of a
    run driven alone (the review found such an override silently skipped)."""
    journal = NotingJournal(tmp_path / "j.db")
    plan = plans()[0]
    with Runtime(journal) as rt:
        assert "completed" == rt.run(plan).state
    step = [["StepRequested"], ["StepEffected", "StepConfirmed"]]
    # Every batch but the last, which carries the run's seal and so goes through append_sealed.
    assert [["RunStarted"], *step * STEPS] == journal.noted
    assert (True, False) == (JournalWriter(SqliteJournal(tmp_path / "k.db"))._direct, JournalWriter(journal)._direct)
