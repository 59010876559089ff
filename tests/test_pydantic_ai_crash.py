"""pydantic-ai runs over real SIGKILLs: each pass is its own process, the journal a real SQLite file.

The agent is a real pydantic-ai ``Agent`` with a ``FunctionModel`` (no network). The
child (tests/pydantic_ai_child.py) writes one line per real model request and per real
tool effect, with the idempotency key it was given, so the counts survive the kill.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from effectlog.errors import ExitStatus
from provider_standin import ProviderStandIn
from session_kit import ROOT, keys

pytestmark = pytest.mark.crash

CHILD = ROOT / "tests" / "pydantic_ai_child.py"
RUN = "order-7"


def child(
    tmp: Path, tool: str, mode: str, prompt: str | None = None, url: str | None = None
) -> tuple[list[str], dict[str, str]]:
    argv = [sys.executable, str(CHILD), str(tmp / "runs.db"), RUN, str(tmp / "calls.log"), tool, mode]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    env.pop("PROVIDER_URL", None)
    if url is not None:
        env["PROVIDER_URL"] = url
    return argv + ([prompt] if prompt else []), env


def one_pass(
    tmp: Path, tool: str, mode: str, prompt: str | None = None, url: str | None = None
) -> subprocess.CompletedProcess[str]:
    argv, env = child(tmp, tool, mode, prompt, url)
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectlog", *args], capture_output=True, text=True, timeout=60, check=False
    )


def output(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert 0 == done.returncode, done.stderr
    return dict(json.loads(done.stdout.splitlines()[-1]))


def test_killed_inside_a_non_idempotent_tool_stops_uncertain_then_reconciled_completes_with_one_effect(
    tmp_path: Path,
) -> None:
    """(a) SIGKILL after the charge's effect: the resumed pass stops (exit 3) with the reconcile command,
    runs no tool; the operator reconciles from the CLI; the next pass completes (the model is told the
    reconciled outcome), a later one replays it; one charge in all."""
    calls = tmp_path / "calls.log"
    assert -signal.SIGKILL == one_pass(tmp_path, "charge", "die-in-tool").returncode
    resumed = one_pass(tmp_path, "charge", "live")
    assert ExitStatus.STOPPED_UNCERTAIN == resumed.returncode, resumed.stderr
    assert resumed.stderr.startswith("UncertainEffect: ")
    command = resumed.stderr.split("Reconcile it with evidence: ", 1)[1].strip()
    expected = f"effectlog reconcile --journal {tmp_path / 'runs.db'} --run-id {RUN} --step tool-1-call-1 --attempt 1 "
    assert command.startswith(expected)
    assert 1 == len(keys(calls, "effect"))
    reconciled = cli(
        "reconcile", "--journal", str(tmp_path / "runs.db"), "--run-id", RUN, "--step", "tool-1-call-1",
        "--outcome", "applied", "--evidence", "charge ch_1 found at the bank", "--operator", "ann",
    )  # fmt: skip
    assert 0 == reconciled.returncode, reconciled.stderr
    done = output(one_pass(tmp_path, "charge", "live"))
    expected_return = {
        "reconciled": True,
        "outcome": "applied",
        "evidence": "charge ch_1 found at the bank",
        "operator": "ann",
    }
    assert {"output": f"done: {json.dumps([expected_return], sort_keys=True)}"} == done
    assert done == output(one_pass(tmp_path, "charge", "live"))  # the completed run replays the reconciled call
    assert 1 == len(keys(calls, "effect"))
    model_keys = keys(calls, "model")
    assert 2 == len(model_keys) == len(set(model_keys))  # one call per model step, none paid twice


def test_killed_inside_an_idempotent_tool_resends_with_the_same_key(tmp_path: Path) -> None:
    """(b) SIGKILL after the lookup's effect: the resumed pass re-sends it with the same idempotency key
    (so a service deduplicating by key applies it once) and completes."""
    calls = tmp_path / "calls.log"
    assert -signal.SIGKILL == one_pass(tmp_path, "lookup", "die-in-tool").returncode
    done = output(one_pass(tmp_path, "lookup", "live"))
    assert {"output": 'done: ["looked up 5 to bob"]'} == done
    effect_keys = keys(calls, "effect")
    assert 2 == len(effect_keys)
    assert 1 == len(set(effect_keys))  # the same key both times: one effect at a key-honouring service
    model_keys = keys(calls, "model")
    assert 2 == len(model_keys) == len(set(model_keys))


def test_killed_during_a_model_request_bills_each_model_step_once(tmp_path: Path) -> None:
    """(c) SIGKILL while the first model request is in flight: the resumed pass re-sends it with the same
    Idempotency-Key; every other request is made once; a third pass makes no request at all."""
    calls = tmp_path / "calls.log"
    assert -signal.SIGKILL == one_pass(tmp_path, "charge", "die-in-model").returncode
    assert {"output": 'done: ["charged 5 to bob"]'} == output(one_pass(tmp_path, "charge", "live"))
    model_keys = keys(calls, "model")
    first, second = f"{RUN}/model-0/", f"{RUN}/model-1/"
    assert [first, first, second] == [k[: len(first)] for k in model_keys]
    assert model_keys[0] == model_keys[1]  # the in-flight request re-sent under its key: billed once
    assert 2 == len(set(model_keys))  # two model steps, two distinct keys
    assert 1 == len(keys(calls, "effect"))
    assert {"output": 'done: ["charged 5 to bob"]'} == output(one_pass(tmp_path, "charge", "live"))
    assert 3 == len(keys(calls, "model"))  # the completed run replays: nothing is called again


def test_approval_held_approved_from_the_cli_while_the_app_is_not_running_then_executed_once(
    tmp_path: Path,
) -> None:
    """A charge needing approval: the pass ends with pydantic-ai's DeferredToolRequests carrying the approve
    command, nothing charged; a person approves from the CLI; the next pass charges once; a third, never."""
    calls = tmp_path / "calls.log"
    held = output(one_pass(tmp_path, "charge", "approve"))
    meta = held["deferred"]
    assert isinstance(meta, dict)
    command = meta["call-1"]["effectlog"]["command"]
    step = meta["call-1"]["effectlog"]["step_id"]
    journal = tmp_path / "runs.db"
    approve = f"effectlog approve --journal {journal} --run-id {RUN} --step {step} --attempt 1 --by NAME"
    assert command.startswith(approve)
    assert " --expect-digest " in command  # the approval is pinned to the exact call the person saw
    assert [] == keys(calls, "effect")
    status = cli("status", "--journal", str(tmp_path / "runs.db"), "--run-id", RUN)
    assert f"run {RUN}: suspended" == status.stdout.splitlines()[0].split(" (")[0]
    approved = cli("approve", "--journal", str(tmp_path / "runs.db"), "--run-id", RUN, "--step", step, "--by", "ann")
    assert 0 == approved.returncode, approved.stderr
    assert {"output": 'done: ["charged 5 to bob"]'} == output(one_pass(tmp_path, "charge", "approve"))
    assert {"output": 'done: ["charged 5 to bob"]'} == output(one_pass(tmp_path, "charge", "approve"))
    assert 1 == len(keys(calls, "effect"))
    assert 2 == len(keys(calls, "model"))


def test_a_changed_prompt_on_resume_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """Divergence: a pass that asks the recorded model step with another prompt exits 5 (conflict)
    naming the step; no model request and no tool call is made."""
    calls = tmp_path / "calls.log"
    assert -signal.SIGKILL == one_pass(tmp_path, "lookup", "die-in-tool").returncode
    before = (len(keys(calls, "model")), len(keys(calls, "effect")))
    diverged = one_pass(tmp_path, "lookup", "live", prompt="charge bob 500")
    assert ExitStatus.CONFLICT == diverged.returncode, diverged.stderr
    assert diverged.stderr.startswith("IdempotencyConflict: ")
    assert "step 'model-0'" in diverged.stderr
    assert before == (len(keys(calls, "model")), len(keys(calls, "effect")))


@pytest.mark.parametrize("tool", ["charge", "lookup"])
def test_a_second_pass_while_the_first_is_inside_a_tool_is_refused_and_writes_nothing(
    tmp_path: Path, tool: str
) -> None:
    """While one process is inside the tool, a second pass of the same run exits 6 (RunOwned): it neither
    re-sends the call nor records it as uncertain; the first pass then completes with one effect."""
    calls = tmp_path / "calls.log"
    argv, env = child(tmp_path, tool, "hold")
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120  # the child imports pydantic_ai: slow on a loaded machine
        while not keys(calls, "effect") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert 1 == len(keys(calls, "effect"))
        second = one_pass(tmp_path, tool, "live")
        assert ExitStatus.LOCKED == second.returncode, second.stderr
        assert second.stderr.startswith("RunOwned: ")
        assert (1, 1) == (len(keys(calls, "model")), len(keys(calls, "effect")))
    finally:
        (tmp_path / "calls.go").touch()
        out, err = first.communicate(timeout=60)
    assert 0 == first.returncode, err
    effect = "charged 5 to bob" if tool == "charge" else "looked up 5 to bob"
    assert {"output": f"done: {json.dumps([effect])}"} == json.loads(out.splitlines()[-1])
    assert 1 == len(keys(calls, "effect"))


def test_an_openai_compatible_provider_bills_each_model_step_once_over_a_kill(tmp_path: Path) -> None:
    """Item 4 on the wire: pydantic-ai's OpenAIChatModel against a local OpenAI-compatible stand-in that
    honours Idempotency-Key. SIGKILL after the provider answered model-0, before the answer was
    recorded: the resumed pass re-sends it under the same key, the provider answers from its record,
    and each of the two model steps is billed once."""
    provider = ProviderStandIn([("charge", {"to": "bob", "amount": 5}), "done"]).start()
    try:
        assert -signal.SIGKILL == one_pass(tmp_path, "charge", "die-after-model-call", url=provider.url).returncode
        assert {"output": "done"} == output(one_pass(tmp_path, "charge", "live", url=provider.url))
        assert {"output": "done"} == output(one_pass(tmp_path, "charge", "live", url=provider.url))
    finally:
        provider.stop()
    assert (2, 1, 3) == (provider.billed, provider.replayed, provider.requests)
    first, resent, final = (str(k) for k in provider.keys_seen)
    assert first == resent
    assert [f"{RUN}/model-0/", f"{RUN}/model-1/"] == [first[: len(RUN) + 9], final[: len(RUN) + 9]]
    assert 1 == len(keys(tmp_path / "calls.log", "effect"))
