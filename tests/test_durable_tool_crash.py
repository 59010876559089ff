"""``@durable.tool`` over real processes: each pass is a child running one ``durable.run`` block,
killed with SIGKILL inside a tool right after its effect, resumed by running the block again.

The program is tests/durable_child.py: ``reserve`` (idempotent, honours its key), then
``charge`` (not idempotent; over 100 it waits for approval).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from effectlog.errors import ExitStatus
from effectlog.session import SqliteCheckpointer
from session_kit import ROOT, keys

pytestmark = pytest.mark.crash

RUN = "onboard-42"


def child(tmp_path: Path, mode: str, amount: int = 5) -> tuple[int, dict[str, Any]]:
    """One pass in a child process: its exit status and the JSON of its last line (empty if killed)."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "durable_child.py"),
            str(tmp_path / "runs.db"),
            RUN,
            str(tmp_path / "calls.log"),
            mode,
            str(amount),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    out = done.stdout.strip().splitlines()
    return done.returncode, (json.loads(out[-1]) if out else {})


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "effectlog",
            *args[:1],
            "--journal",
            str(tmp_path / "runs.db"),
            "--run-id",
            RUN,
            *args[1:],
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    return done


def step_states(tmp_path: Path) -> dict[str, str]:
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        return {s.step_id: s.state for s in store.load(RUN).steps}


def test_killed_inside_a_non_idempotent_tool_stops_uncertain_and_is_reconciled_from_the_cli(tmp_path: Path) -> None:
    """SIGKILL right after the charge: the resume stops with the reconcile command and charges nothing;
    reconciled as applied from the CLI, the next pass completes with the documented value; one charge."""
    calls = tmp_path / "calls.log"
    status, _ = child(tmp_path, "die-in-charge")
    assert -signal.SIGKILL == status
    assert {"step-0": "confirmed", "step-1": "requested"} == step_states(tmp_path)

    status, out = child(tmp_path, "live")
    assert (int(ExitStatus.STOPPED_UNCERTAIN), "uncertain_effect", "step-1") == (status, out["error"], out["step"])
    expected_command = (
        f"effectlog reconcile --journal {tmp_path / 'runs.db'} --run-id {RUN} --step step-1 --attempt 1 "
        "--outcome applied|not-applied --evidence TEXT --operator NAME"
    )
    assert expected_command == out["command"]
    assert 1 == len(keys(calls, "charge"))
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        assert ("stopped", "uncertain") == (store.state(RUN).state, store.state(RUN).step("step-1").state)

    cli(
        tmp_path,
        "reconcile",
        "--step",
        "step-1",
        "--outcome",
        "applied",
        "--evidence",
        "bank line 7",
        "--operator",
        "ann",
    )
    status, out = child(tmp_path, "live")
    assert 0 == status
    reconciled = {"outcome": "applied", "evidence": "bank line 7", "operator": "ann", "automated": False}
    assert {"reserve": {"item": "sku-1", "reserved": True}, "charge": reconciled} == out["result"]
    assert (0, 1, 1) == (out["tool_calls"], len(keys(calls, "charge")), len(keys(calls, "reserve")))

    status, out = child(tmp_path, "live")  # the completed run answers from the journal
    assert (0, 0, 1) == (status, out["tool_calls"], len(keys(calls, "charge")))


def test_killed_inside_an_idempotent_tool_resends_with_the_same_key(tmp_path: Path) -> None:
    """SIGKILL right after the reservation: the resume sends it again with the same key, so the API
    applies it once, and the run completes with one charge."""
    calls = tmp_path / "calls.log"
    status, _ = child(tmp_path, "die-in-reserve")
    assert -signal.SIGKILL == status
    status, out = child(tmp_path, "live")
    assert 0 == status, out
    sent = keys(calls, "reserve")
    assert (2, 1) == (len(sent), len(set(sent)))  # sent twice, one key: applied once
    assert 1 == len(keys(calls, "charge"))
    assert {"item": "sku-1", "reserved": False} == out["result"]["reserve"]  # the API saw the key again
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        timeline = [type(e).__struct_config__.tag for e in store.load(RUN).events]  # type: ignore[misc]
    assert 1 == timeline.count("step.resent")


def test_a_held_charge_is_approved_from_the_cli_while_the_app_is_not_running_and_runs_once(tmp_path: Path) -> None:
    """A charge over 100 suspends the run (exit 4, with the approve command); `effectlog approve` while
    no process runs the block; the next pass charges once; the pass after it charges nothing."""
    calls = tmp_path / "calls.log"
    status, out = child(tmp_path, "live", amount=500)
    assert (int(ExitStatus.SUSPENDED), "approval_required", "step-1") == (status, out["error"], out["step"])
    assert out["command"].startswith(f"effectlog approve --journal {tmp_path / 'runs.db'} --run-id {RUN} --step step-1")
    assert 0 == len(keys(calls, "charge"))

    status, out = child(tmp_path, "live", amount=500)  # nobody decided yet: still held, nothing runs
    assert (int(ExitStatus.SUSPENDED), 0) == (status, len(keys(calls, "charge")))

    cli(tmp_path, "approve", "--step", "step-1", "--by", "alice")
    status, out = child(tmp_path, "live", amount=500)
    assert (0, {"order": "order-1", "charged": 500}) == (status, out["result"]["charge"])
    status, out = child(tmp_path, "live", amount=500)
    assert (0, 1, 1) == (status, len(keys(calls, "charge")), len(keys(calls, "reserve")))


def test_an_approval_is_bound_to_the_exact_call(tmp_path: Path) -> None:
    """Approved for 500, the program now asks for 900 at that step: divergence, nothing is charged."""
    child(tmp_path, "live", amount=500)
    cli(tmp_path, "approve", "--step", "step-1", "--by", "alice")
    status, out = child(tmp_path, "live", amount=900)
    assert (int(ExitStatus.CONFLICT), "replay_divergence", "step-1") == (status, out["error"], out["step"])
    assert 0 == len(keys(tmp_path / "calls.log", "charge"))


def test_a_changed_call_sequence_raises_replay_divergence_and_runs_nothing(tmp_path: Path) -> None:
    """Killed in the charge, then resumed by a program that charges before it reserves: the journal's
    step-0 is a reservation, so the pass stops with ReplayDivergence (exit 5) before any call."""
    calls = tmp_path / "calls.log"
    status, _ = child(tmp_path, "die-in-charge")
    assert -signal.SIGKILL == status
    status, out = child(tmp_path, "reordered")
    assert (int(ExitStatus.CONFLICT), "replay_divergence", "step-0") == (status, out["error"], out["step"])
    assert (1, 1) == (len(keys(calls, "charge")), len(keys(calls, "reserve")))
    assert {"step-0": "confirmed", "step-1": "requested"} == step_states(tmp_path)
