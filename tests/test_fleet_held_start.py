"""A runner's fresh run writes ``run.started`` with its next batch, not in a commit of its own
(``LeasedJournal.hold_start``): one commit per run fewer, and nothing outside the process can tell.

In one process: a two-step run takes five commits on SQLite, the journal holds every event, and
what ``append`` returned for the held event is the record stored. With real processes and SIGKILL:
a runner killed while it holds ``run.started`` (at its first step's request, before the tool) left
no event, its attempt is lost and requeued, and the next runner runs every step exactly once.
"""

from __future__ import annotations

import io
import signal
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from effectlog import events as ev
from effectlog.fleet import FleetStore, open_store
from effectlog.fleet.contract import noop_plan
from effectlog.fleet.leased_journal import LeasedJournal
from effectlog.fleet.runner import Runner, RunnerConfig
from effectlog.journal import load_run
from fleet_kit import RunnerProcess, effectlog, wait_until, write_plan
from test_fleet_processes import FAST, effect_rows, tags

pytest_plugins = ["pg_fixture", "fleet_kit"]


def test_a_two_step_run_takes_five_commits_and_its_journal_holds_every_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One runner, two queued two-step requests: eleven commits with rows changed from the runner's start to
    its exit, the first claim and five per run (run.started with the first request, the first confirmation,
    the second request, the second confirmation, run.completed with the attempt's success and the next
    claim; six per run before). Each run's journal holds all eight events, in order, the first being the
    record ``append`` returned when it held it, when the run had no event yet."""
    commits: list[int] = []
    real_connect = sqlite3.connect

    def counted(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        db = real_connect(*args, **kwargs)
        mark = [db.total_changes]

        def trace(text: str) -> None:
            if text.lstrip()[:6].upper() == "COMMIT" or not db.in_transaction:
                if db.total_changes != mark[0]:
                    commits.append(1)
                mark[0] = db.total_changes

        db.set_trace_callback(trace)
        return db

    held: list[Any] = []
    real_append = LeasedJournal.append

    def noted(self: LeasedJournal, events: Any) -> Any:
        records = real_append(self, events)
        if events and isinstance(events[0], ev.RunStarted):
            held.append((records, self.base.head(self.lease.run_id)))
        return records

    monkeypatch.setattr(sqlite3, "connect", counted)
    monkeypatch.setattr(LeasedJournal, "append", noted)
    path = str(tmp_path / "fleet.db")
    with open_store(path) as store:
        for i in range(2):
            store.submit("held", f"k{i}", noop_plan(f"run-held-{i}", steps=2))
        runner = Runner(RunnerConfig(store=path, exit_when_idle=True, recover=False), store, log=io.StringIO())
        commits.clear()
        assert 0 == runner.serve()
        stored = [list(store.journal().read(f"run-held-{i}")) for i in range(2)]
        assert ["succeeded"] * 2 == [r.state for r in store.requests()]
    expected_tags = ["run.started", "step.requested", "step.effected", "step.confirmed"] * 1
    expected_tags = [*expected_tags, *expected_tags[1:], "run.completed"]
    assert [expected_tags] * 2 == [[ev.tag_of(ev.decode(r.body)) for r in run] for run in stored]
    assert [(0, [(r.run_id, r.seq, r.body, r.hash) for r in run[:1]]) for run in stored] == [
        (head_then[0], [(r.run_id, r.seq, r.body, r.hash) for r in returned]) for returned, head_then in held
    ]
    assert 1 + 2 * 5 == len(commits)


@pytest.mark.crash
def test_a_runner_killed_holding_run_started_leaves_no_event_and_the_next_runner_runs_each_step_once(
    store_url: str, store: FleetStore, runners: list[RunnerProcess], tmp_path: Path
) -> None:
    """SIGKILL a runner at its first step's request (before the batch that writes it and the held run.started).

    Proves: the run has no event, the recovery service finds the attempt lost (no step was requested) and
    requeues the request, and the next runner starts the run afresh and invokes each step exactly once."""
    plan = write_plan(tmp_path / "job.json", "job-held", [("build", "control"), ("push", "control")])
    effectlog("submit", str(plan), "--store", store_url, "--scope", "ci", "--key", "job-held")
    holder = RunnerProcess(store_url, tmp_path, "A", arm="before_append:step.requested", extra=FAST)
    runners.append(holder)
    assert "before_append:step.requested build" == holder.reached()
    assert [] == tags(store, "job-held")  # run.started is held, not written
    holder.signal(signal.SIGKILL)
    holder.wait()

    other = RunnerProcess(store_url, tmp_path, "B", extra=(*FAST, "--max-attempts", "1"))
    runners.append(other)
    assert 0 == other.wait()
    wait_until(lambda: store.requests(["succeeded"]) or None, "the request to succeed")
    assert [(1, "lost", "A", 1), (2, "succeeded", "B", 2)] == [
        (a.attempt_no, a.state, a.runner_id, a.token) for a in store.attempts()
    ]
    assert {"build": 1, "push": 1} == dict(Counter(step for _, step, _ in effect_rows(tmp_path / "effects.db")))
    journal_tags = tags(store, "job-held")
    assert (1, 0) == (journal_tags.count("run.started"), journal_tags.count("run.resumed"))
    assert "completed" == load_run(store.journal(), "job-held").state
