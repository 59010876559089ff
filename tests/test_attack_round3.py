"""Attacks on this session's changes (the lazy resume from the last checkpoint segment's frontier, the
PostgreSQL fenced append on a cached head, SQLite idle runners on inotify, the recursive ``runs()``
skip-scan and ``read()`` without the run id, the fleet claim's queue index): each test is one
suspicion, kept as a regression test. Real SQLite files, real PostgreSQL, real processes."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from effectlog import events as ev
from effectlog.adapters import EffectStore
from effectlog.errors import ExitStatus
from effectlog.journal import Journal, SqliteJournal, checkpoint, load_run, resume_point
from effectlog.journal import frontier as fr
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import Runtime, SimulatedCrash

pytest_plugins = ["pg_fixture"]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectlog", *args], env=env, capture_output=True, text=True, timeout=120
    )


def _stop_at(step_id: str, point: str, times: list[int] | None = None):  # type: ignore[no-untyped-def]
    def hook(where: str, sid: str) -> None:
        if where == point and sid == step_id:
            raise SimulatedCrash(where)

    return hook


@pytest.fixture
def every_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint segment with every batch of an open run."""
    monkeypatch.setattr(checkpoint, "EVERY_EVENTS", 1)


def _mixed_plan(run_id: str) -> Plan:
    steps = tuple(
        StepDecl(id=f"s{i}", adapter="tool", args={"i": i}, approval="required" if i in (2, 5) else None)
        for i in range(7)
    )
    return Plan(run_id=run_id, adapters={"tool": AdapterDecl(type="effects.control", idempotent=False)}, steps=steps)


def _lazy_equals_replay(open_journal: Callable[[], Journal], plan: Plan) -> RunStateish:
    with open_journal() as reader:  # type: ignore[attr-defined]
        point = resume_point(reader, plan.run_id, plan)
        full = load_run(reader, plan.run_id)
        # Answers before anything is loaded, then the loaded state.
        for decl in plan.steps:
            assert (full.steps.get(decl.id) is not None and full.steps[decl.id].done) == fr.is_done(
                point.state.steps, decl.id
            ), decl.id
            assert full.steps.get(decl.id) == point.state.steps.get(decl.id), decl.id
        assert full == fr.loaded(point.state)
        return full


RunStateish = Any


def _drive_mixed(
    journal: Callable[[], Journal], open_reader: Callable[[], Journal], where: str, effects: Path
) -> list[int]:
    """One run through approvals, crashes before an effect, after one and after a confirmation, an
    operator's reconcile (both outcomes), each operator decision by the CLI (in the tail after the last
    segment), and a resume from the segments after each; the effect count per step at the end."""
    plan = _mixed_plan("mix")
    ops = ("--journal", where, "--run-id", "mix")

    def run(hook: Any = None) -> Any:
        with Runtime(journal(), effects=effects, crash_hook=hook) as rt:
            return rt.run(plan)

    assert "suspended" == run().state  # s2 waits
    assert 0 == cli("approve", *ops, "--step", "s2", "--by", "ops").returncode
    _lazy_equals_replay(open_reader, plan)
    with pytest.raises(SimulatedCrash):
        run(_stop_at("s3", "after_request"))  # requested, never sent: uncertain on resume
    _lazy_equals_replay(open_reader, plan)
    assert "stopped" == run().state
    _lazy_equals_replay(open_reader, plan)
    done = cli("reconcile", *ops, "--step", "s3", "--outcome", "not-applied", "--evidence", "ledger", "--operator", "ops")
    assert 0 == done.returncode, done.stderr
    _lazy_equals_replay(open_reader, plan)
    with pytest.raises(SimulatedCrash):
        run(_stop_at("s3", "after_effect"))  # attempt 2 applied, its receipt not durable: uncertain again
    _lazy_equals_replay(open_reader, plan)
    assert "stopped" == run().state
    done = cli("reconcile", *ops, "--step", "s3", "--outcome", "applied", "--evidence", "ledger", "--operator", "ops")
    assert 0 == done.returncode, done.stderr
    _lazy_equals_replay(open_reader, plan)
    with pytest.raises(SimulatedCrash):
        run(_stop_at("s4", "after_confirm"))
    _lazy_equals_replay(open_reader, plan)
    assert "suspended" == run().state  # s5 waits
    assert 0 == cli("approve", *ops, "--step", "s5", "--by", "ops").returncode
    with pytest.raises(SimulatedCrash):
        run(_stop_at("s6", "after_request"))
    _lazy_equals_replay(open_reader, plan)
    assert "stopped" == run().state
    done = cli("reconcile", *ops, "--step", "s6", "--outcome", "not-applied", "--evidence", "ledger", "--operator", "ops")
    assert 0 == done.returncode, done.stderr
    _lazy_equals_replay(open_reader, plan)
    outcome = run()
    assert "completed" == outcome.state, outcome.message
    store = EffectStore(str(effects))
    try:
        return [store.count(run_id="mix", step_id=f"s{i}") for i in range(7)]
    finally:
        store.close()


@pytest.mark.usefixtures("every_1")
def test_sqlite_lazy_resume_through_operator_decisions_and_crashes_equals_the_replay(tmp_path: Path) -> None:
    """SQLite, a segment with every batch: after each stop (approval, crash before and after an
    effect, uncertain, reconcile not-applied twice) the lazy resume point answers every step as the
    full replay does, each effect is applied exactly once, and ``verify`` passes."""
    path = tmp_path / "j.db"
    counts = _drive_mixed(
        lambda: SqliteJournal(path), lambda: SqliteJournal(path, writer=False), str(path), tmp_path / "e.db"
    )
    assert [1] * 7 == counts
    assert 0 == cli("verify", "--journal", str(path)).returncode


@pytest.mark.postgres
@pytest.mark.usefixtures("every_1")
def test_postgresql_lazy_resume_through_operator_decisions_and_crashes_equals_the_replay(
    pg_url: str, tmp_path: Path
) -> None:
    """The same on PostgreSQL (its own ``last_checkpoint_row``): every resume point equals the full
    replay, each effect exactly once, ``verify`` passes."""
    from effectlog.journal.postgres import PostgresJournal

    counts = _drive_mixed(
        lambda: PostgresJournal(pg_url), lambda: PostgresJournal(pg_url, writer=False), pg_url, tmp_path / "e.db"
    )
    assert [1] * 7 == counts
    done = cli("verify", "--journal", pg_url)
    assert 0 == done.returncode, done.stderr
