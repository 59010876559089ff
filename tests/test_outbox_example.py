"""The example adapter with its own ledger (examples/outbox_adapter.py), reconciled by ``--lookup``
after a real SIGKILL.

A worker process is killed with SIGKILL at a boundary of the step (the crash matrix's
worker and pipe: no timing); the resume stops on the uncertain step (exit 3);
``effectlog reconcile --lookup`` asks the example's own ``lookup``; the next resume
completes with exactly one message in the example's outbox.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from effectlog.crashmatrix.processes import ProcessRecord, effectlog_argv, run_process

pytest_plugins = ["pg_fixture"]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ADAPTERS = ("--adapters", "outbox_adapter:ADAPTERS")


def plan(run_id: str) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "adapters": {
            "mail": {"type": "example.outbox", "version": "1", "idempotent": False, "options": {"ledger": "outbox.db"}}
        },
        "steps": [
            {"id": "welcome", "adapter": "mail", "args": {"to": "ada@example.com", "subject": "Welcome"}},
        ],
    }


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        effectlog_argv(*args), cwd=cwd, capture_output=True, text=True, timeout=120, check=False, env=_env()
    )


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def outbox(cwd: Path) -> list[tuple[str, int]]:
    db = sqlite3.connect(cwd / "outbox.db")
    try:
        return [(r[0], r[1]) for r in db.execute("SELECT run_id, attempt FROM outbox ORDER BY message_id")]
    finally:
        db.close()


def kill_worker_at(cwd: Path, monkeypatch: pytest.MonkeyPatch, journal: str, arm: str) -> ProcessRecord:
    """Run plan.json in a worker that reports reaching ``arm`` and is then SIGKILLed there."""
    monkeypatch.chdir(cwd)  # the worker inherits the directory (the ledger path is relative) and env
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    sys.path.insert(0, str(EXAMPLES))
    try:
        from outbox_adapter import create_ledger  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(EXAMPLES))
    create_ledger("outbox.db")  # the application's outbox exists before any run uses it
    argv = effectlog_argv("crash-matrix", "worker", "--plan", "plan.json", "--journal", journal, *ADAPTERS)
    return run_process("worker", argv, arm)


CASES = {
    # crash point, the outcome lookup finds, the attempt of the one message in the outbox
    "killed-after-the-message-was-queued": ("after_effect", "applied", 1),
    "killed-before-the-message-was-queued": ("after_request", "not_applied", 2),
}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.parametrize(("arm", "outcome", "attempt"), CASES.values(), ids=CASES.keys())
def test_the_example_outbox_is_reconciled_by_its_own_lookup_after_sigkill(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    *,
    backend: str,
    arm: str,
    outcome: str,
    attempt: int,
) -> None:
    """SIGKILL at the boundary; the resume exits 3; ``reconcile --lookup`` records the outbox's
    answer (automated, with the example adapter's identity); the next resume exits 0 with one
    message, for attempt 1 when it had been queued, for attempt 2 (a new key) when it had not."""
    journal = request.getfixturevalue("pg_url") if backend == "postgres" else str(tmp_path / "journal.db")
    run_id = f"welcome-{arm.replace('_', '-')}"
    (tmp_path / "plan.json").write_text(json.dumps(plan(run_id)))
    killed = kill_worker_at(tmp_path, monkeypatch, journal, arm)

    stopped = cli(tmp_path, "run", "plan.json", "--journal", journal, *ADAPTERS)
    reconciled = cli(
        tmp_path, "reconcile", "--journal", journal, "--run-id", run_id, "--step", "welcome", "--lookup", *ADAPTERS
    )
    timeline = json.loads(cli(tmp_path, "timeline", "--journal", journal, "--run-id", run_id, "--json").stdout)
    done = cli(tmp_path, "run", "plan.json", "--journal", journal, *ADAPTERS)

    assert (9, arm) == (killed.signal, killed.reached), killed.stderr_tail
    assert 3 == stopped.returncode, stopped.stderr
    assert 0 == reconciled.returncode, reconciled.stderr
    event = timeline[-1]
    assert ("step.reconciled", outcome, True) == (event["type"], event["outcome"], event["automated"])
    assert "example.outbox" == event["adapter_identity"]["type"]
    assert 0 == done.returncode, done.stderr
    assert [(run_id, attempt)] == outbox(tmp_path)


def test_the_example_lookup_cannot_tell_without_its_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the outbox file gone the example's ``lookup`` answers None: exit 3, and the step
    stays uncertain (nothing recorded, nothing sent by the next resume)."""
    (tmp_path / "plan.json").write_text(json.dumps(plan("welcome-lost")))
    journal = str(tmp_path / "journal.db")
    killed = kill_worker_at(tmp_path, monkeypatch, journal, "after_effect")
    assert 9 == killed.signal
    assert 3 == cli(tmp_path, "run", "plan.json", "--journal", journal, *ADAPTERS).returncode
    (tmp_path / "outbox.db").rename(tmp_path / "outbox-moved.db")

    undecided = cli(
        tmp_path,
        "reconcile",
        "--journal",
        journal,
        "--run-id",
        "welcome-lost",
        "--step",
        "welcome",
        "--lookup",
        *ADAPTERS,
    )
    again = cli(tmp_path, "run", "plan.json", "--journal", journal, *ADAPTERS)

    assert 3 == undecided.returncode
    assert "lookup cannot tell" in undecided.stderr
    assert 3 == again.returncode
    assert not (tmp_path / "outbox.db").exists()
