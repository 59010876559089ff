"""The write-ahead table, one row per test, each after a real SIGKILL of a child process.

| journal                          | meaning                    | replay                  |
| intent and result                | happened, outcome known    | skips the step          |
| neither                          | never attempted            | runs it                 |
| intent only, not idempotent      | nobody knows               | raises UncertainEffect  |
| intent only, idempotent          | repeating costs nothing    | runs it (same key)      |
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from effectlog.errors import UncertainEffect
from effectlog.session import FinalStep, ModelStep, Session, SqliteCheckpointer, ToolStep
from session_kit import ROOT, count, drive, keys, scripted

pytestmark = pytest.mark.crash

RUN = "run-1"


def crash_pass(tmp_path: Path, point: str, step_id: str, *, idempotent: bool) -> tuple[Path, Path]:
    """Run pass one in a child process that SIGKILLs itself at (point, step_id)."""
    journal, calls = tmp_path / "runs.db", tmp_path / "calls.log"
    child = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "session_child.py"),
            str(journal),
            RUN,
            str(calls),
            point,
            step_id,
            "1" if idempotent else "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert -signal.SIGKILL == child.returncode, child.stderr
    return journal, calls


def resume(journal: Path, calls: Path, *, idempotent: bool) -> list[object]:
    """Pass two, in this process: a new gateway, a new store, the same run id."""
    with SqliteCheckpointer(journal) as store:
        return list(asyncio.run(drive(Session(RUN, scripted(calls, idempotent=idempotent), store))))


def step_states(journal: Path) -> dict[str, str]:
    with SqliteCheckpointer(journal) as store:
        return {s.step_id: s.state for s in store.load(RUN).steps}


def tags(journal: Path) -> list[str]:
    with SqliteCheckpointer(journal) as store:
        return [type(e).__struct_config__.tag for e in store.load(RUN).events]  # type: ignore[misc]


@pytest.mark.parametrize("idempotent", [False, True])
def test_intent_and_result_skips_the_step(tmp_path: Path, idempotent: bool) -> None:
    """Killed right after the tool's result was recorded: the resumed pass reuses it and calls the tool 0 times."""
    journal, calls = crash_pass(tmp_path, "after_result", "step-1", idempotent=idempotent)
    assert {"step-0": "confirmed", "step-1": "confirmed"} == step_states(journal)
    steps = resume(journal, calls, idempotent=idempotent)
    assert 1 == count(calls, "transfer")
    assert 2 == count(calls, "model")  # step-0 in pass one, the final answer in pass two
    tool = next(s for s in steps if isinstance(s, ToolStep))
    assert (True, "ok", {"sent": 5, "to": "bob"}) == (tool.replayed, tool.status, tool.result)
    assert FinalStep(run_id=RUN, result="sent 5 to bob") == steps[-1]


@pytest.mark.parametrize("idempotent", [False, True])
def test_neither_intent_nor_result_runs_the_step(tmp_path: Path, idempotent: bool) -> None:
    """Killed before the tool's intent was written: nothing was attempted, so the resumed pass runs it once."""
    journal, calls = crash_pass(tmp_path, "before_intent", "step-1", idempotent=idempotent)
    assert {"step-0": "confirmed"} == step_states(journal)
    assert 0 == count(calls, "transfer")
    steps = resume(journal, calls, idempotent=idempotent)
    tool = next(s for s in steps if isinstance(s, ToolStep))
    assert (False, "ok") == (tool.replayed, tool.status)
    assert 1 == count(calls, "transfer")
    assert isinstance(steps[-1], FinalStep)


def test_intent_only_not_idempotent_raises_uncertain_effect(tmp_path: Path) -> None:
    """Killed after a non-idempotent tool ran but before its result was recorded: the resume refuses to guess."""
    journal, calls = crash_pass(tmp_path, "after_call", "step-1", idempotent=False)
    assert 1 == count(calls, "transfer")  # it did happen; the journal cannot know
    assert {"step-0": "confirmed", "step-1": "requested"} == step_states(journal)
    with pytest.raises(UncertainEffect) as raised:
        resume(journal, calls, idempotent=False)
    assert ("run-1", "step-1") == (raised.value.run_id, raised.value.step_id)
    assert raised.value.fields["command"].startswith(f"effectlog reconcile --journal {journal} --run-id run-1")
    assert 1 == count(calls, "transfer")
    assert {"step-0": "confirmed", "step-1": "uncertain"} == step_states(journal)
    assert ["run.resumed", "step.uncertain", "run.stopped"] == tags(journal)[-3:]
    before = tags(journal)
    with pytest.raises(UncertainEffect):  # asking again changes nothing and writes nothing
        resume(journal, calls, idempotent=False)
    assert before == tags(journal)


@pytest.mark.parametrize(
    ("outcome", "expected_transfers", "expected_status"),
    [("applied", 1, "reconciled"), ("not-applied", 2, "ok")],
)
def test_uncertain_effect_is_resolved_with_effectlog_reconcile(
    tmp_path: Path, outcome: str, expected_transfers: int, expected_status: str
) -> None:
    """`effectlog reconcile` on a session step: applied is never re-run; not-applied runs once more, new key."""
    journal, calls = crash_pass(tmp_path, "after_call", "step-1", idempotent=False)
    with pytest.raises(UncertainEffect):
        resume(journal, calls, idempotent=False)
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "effectlog",
            "reconcile",
            "--journal",
            str(journal),
            "--run-id",
            RUN,
            "--step",
            "step-1",
            "--outcome",
            outcome,
            "--evidence",
            "bank statement line 7",
            "--operator",
            "alice",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert 0 == cli.returncode, cli.stderr
    steps = resume(journal, calls, idempotent=False)
    tool = next(s for s in steps if isinstance(s, ToolStep))
    assert expected_status == tool.status
    assert expected_transfers == count(calls, "transfer")
    assert len(set(keys(calls, "transfer"))) == expected_transfers  # a new attempt gets a new key
    assert FinalStep(run_id=RUN, result="sent 5 to bob") == steps[-1]


def test_intent_only_idempotent_tool_runs_again_with_the_same_key(tmp_path: Path) -> None:
    """Killed after an idempotent tool ran but before its result was recorded: it runs again, same key."""
    journal, calls = crash_pass(tmp_path, "after_call", "step-1", idempotent=True)
    assert {"step-0": "confirmed", "step-1": "requested"} == step_states(journal)
    steps = resume(journal, calls, idempotent=True)
    first, second = keys(calls, "transfer")
    assert first == second
    tool = next(s for s in steps if isinstance(s, ToolStep))
    assert (False, "ok") == (tool.replayed, tool.status)
    assert "step.resent" in tags(journal)
    assert isinstance(steps[-1], FinalStep)


def test_intent_only_model_call_runs_again_with_the_same_key(tmp_path: Path) -> None:
    """Killed after the model answered but before the answer was recorded: it is asked again with the same key."""
    journal, calls = crash_pass(tmp_path, "after_call", "step-0", idempotent=False)
    assert {"step-0": "requested"} == step_states(journal)
    steps = resume(journal, calls, idempotent=False)
    assert 3 == count(calls, "model")  # step-0 twice (same key), then the final answer
    first, again, _final = keys(calls, "model")
    assert first == again
    assert isinstance(steps[0], ModelStep)
    assert not steps[0].replayed
    assert 1 == count(calls, "transfer")
