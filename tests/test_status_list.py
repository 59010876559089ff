"""`status` lists runs from summaries, newest first, filtered and limited (issue 13 item 17).

Closed runs are summarised from their seals, open ones replayed; a summary must never
claim what the full replay would not give, so each run's listed entry is compared with
``status --run-id`` (a full replay) as real ``effectlog`` processes.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from effectlog.cli.run_views import status_dict
from effectlog.journal import SqliteJournal, load_run
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import Runtime, SimulatedCrash
from effectlog.summary import summaries
from hardening_kit import effectlog, one_line


def plan(run_id: str, *, adapter: str = "noop", idempotent: bool = True, approval: bool = False) -> Plan:
    return Plan(
        run_id=run_id,
        adapters={"a": AdapterDecl(type=adapter, idempotent=idempotent)},
        steps=(
            StepDecl(id="first", adapter="a"),
            StepDecl(id="second", adapter="a", approval="required" if approval else None),
        ),
    )


def deny_all(request: Any) -> str:
    return "deny"


def crash_after_request(point: str, step_id: str) -> None:
    if (point, step_id) == ("after_request", "second"):
        raise SimulatedCrash(point)


def ticking() -> Iterator[int]:
    return itertools.count(1_700_000_000_000_000_000, 1_000_000_000)


# Run ids are in reverse order of their start, so "newest first" is not "by name".
EXPECTED_STATES = {
    "z-completed": "completed",
    "y-failed": "failed",
    "x-suspended": "suspended",
    "w-stopped": "stopped",
    "v-running": "running",
}


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    """One run in each state a run can be left in by ``run``, started one second apart."""
    path = tmp_path / "journal.db"
    clock = ticking()
    effects = tmp_path / "effects.db"

    def runtime(**kw: Any) -> Runtime:
        return Runtime(SqliteJournal(path), clock=lambda: next(clock), effects=effects, **kw)

    with runtime() as rt:
        rt.run(plan("z-completed"))
    with runtime(policy=deny_all) as rt:
        rt.run(plan("y-failed"))
    with runtime() as rt:
        rt.run(plan("x-suspended", approval=True))
    with runtime(crash_hook=crash_after_request) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan("w-stopped", adapter="effects.control", idempotent=False))
    with runtime() as rt:  # the resume finds the request without a result: uncertain, stopped
        rt.run(plan("w-stopped", adapter="effects.control", idempotent=False))
    with runtime(crash_hook=crash_after_request) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan("v-running"))
    return path


def status(journal: Path, *argv: str) -> Any:
    done = effectlog("status", "--journal", str(journal), *argv, "--json", cwd=journal.parent)
    assert (0, "") == (done.returncode, done.stderr)
    return json.loads(done.stdout)


def test_every_listed_summary_equals_the_full_replay_of_its_run(journal: Path) -> None:
    """For every run, in every state: its entry in ``status --json`` equals ``status --run-id
    R --json`` (which replays it in full), field for field."""
    listed = status(journal)

    singles = [status(journal, "--run-id", entry["run_id"]) for entry in listed]
    assert EXPECTED_STATES == {entry["run_id"]: entry["state"] for entry in listed}
    assert singles == listed


def test_summaries_equal_the_full_replay_in_process_and_read_no_closed_run(journal: Path) -> None:
    """The same comparison through the API, and the point of it: the closed runs' events are
    never read (their seals are), the open ones are replayed."""
    reads: list[str] = []

    class CountingJournal(SqliteJournal):
        def read(self, run_id: str, after_seq: int = 0) -> Any:
            reads.append(run_id)
            return super().read(run_id, after_seq)

    with CountingJournal(journal, writer=False) as j:
        found = summaries(j, j.runs())
        read_by_summaries = list(reads)
        replayed = {r: status_dict(load_run(j, r), j.location) for r in j.runs()}

    assert [replayed[s.run_id] for s in found] == [status_dict(s, str(journal)) for s in found]
    assert sorted(["x-suspended", "w-stopped", "v-running"]) == sorted(read_by_summaries)


def test_runs_are_listed_newest_first(journal: Path) -> None:
    """Newest first by the start of the run, whatever the names' order."""
    listed = status(journal)
    assert list(EXPECTED_STATES)[::-1] == [entry["run_id"] for entry in listed]
    assert sorted((e["started_ts"] for e in listed), reverse=True) == [e["started_ts"] for e in listed]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("--state", "completed"), ["z-completed"]),
        (("--state", "stopped", "--state", "suspended"), ["w-stopped", "x-suspended"]),
        (("--state", "cancelled"), []),
        (("--limit", "2"), ["v-running", "w-stopped"]),
        (("--state", "failed", "--state", "completed", "--limit", "1"), ["y-failed"]),
    ],
)
def test_state_filters_and_limit(journal: Path, argv: tuple[str, ...], expected: list[str]) -> None:
    """--state S (repeatable) keeps runs in those states; --limit N keeps the N newest."""
    assert expected == [entry["run_id"] for entry in status(journal, *argv)]


def test_the_human_list_is_newest_first_and_filtered(journal: Path) -> None:
    """The table without --json: the same order and filter, one row per run; a running run whose
    process is gone reads ``interrupted`` (its owner is no longer alive)."""
    filters = ("--state", "stopped", "--state", "running")
    done = effectlog("status", "--journal", str(journal), *filters, cwd=journal.parent)
    rows = [line.split()[:2] for line in done.stdout.splitlines()[2:]]
    assert (0, [["v-running", "interrupted"], ["w-stopped", "stopped"]]) == (done.returncode, rows)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--state", "done"), "argument --state: invalid choice: 'done'"),
        (("--limit", "0"), "argument --limit: 0 is not positive"),
        (("--limit", "x"), "argument --limit: 'x' is not a whole number"),
        (("--run-id", "z-completed", "--state", "completed"), "do not combine them with --run-id"),
    ],
)
def test_bad_filters_exit_2_with_one_line(journal: Path, argv: tuple[str, ...], message: str) -> None:
    """A state that does not exist, a limit that is not a positive whole number, or a filter
    with --run-id: exit 2, one line naming the problem."""
    done = effectlog("status", "--journal", str(journal), *argv, cwd=journal.parent)
    assert (2, True) == (done.returncode, message in one_line(done.stderr))
