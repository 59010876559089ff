"""OpenAI Agents SDK runs over real SIGKILLs: each pass is its own process, the journal a real SQLite file.

The agent is a real SDK ``Agent`` with the SDK's ``OpenAIChatCompletionsModel`` talking HTTP to
a local OpenAI-compatible stand-in (tests/provider_standin.py) that counts generations per
``Idempotency-Key``. The child (tests/openai_agents_child.py) writes one line per real tool
effect with the idempotency key it was given, so the counts survive the kill.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import agents  # noqa: F401  (a dev dependency: missing, these tests fail here; they are not skipped)
import pytest

from effectlog.errors import ExitStatus
from provider_standin import ProviderStandIn, Reply
from session_kit import ROOT, keys

pytestmark = pytest.mark.crash

CHILD = ROOT / "tests" / "openai_agents_child.py"
RUN = "order-7"
CHARGE: list[Reply] = [("charge", {"to": "bob", "amount": 5}), "done"]
LOOKUP: list[Reply] = [("lookup", {"to": "bob", "amount": 5}), "done"]


def child(tmp: Path, url: str, mode: str, prompt: str | None = None) -> tuple[list[str], dict[str, str]]:
    argv = [sys.executable, str(CHILD), str(tmp / "runs.db"), RUN, str(tmp / "calls.log"), url, mode]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    return argv + ([prompt] if prompt else []), env


def one_pass(tmp: Path, url: str, mode: str, prompt: str | None = None) -> subprocess.CompletedProcess[str]:
    argv, env = child(tmp, url, mode, prompt)
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectlog", *args], capture_output=True, text=True, timeout=60, check=False
    )


def output(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert 0 == done.returncode, done.stderr
    return dict(json.loads(done.stdout.splitlines()[-1]))


@pytest.fixture
def charge_provider() -> Iterator[ProviderStandIn]:
    provider = ProviderStandIn(CHARGE).start()
    yield provider
    provider.stop()


def billed_once_per_step(provider: ProviderStandIn) -> None:
    """Every key the provider saw names one model step, and each step was billed once."""
    assert 2 == provider.billed  # model-0 and model-1
    assert 2 == len({str(k).rsplit("/", 1)[0] for k in provider.keys_seen})


def test_killed_inside_a_non_idempotent_tool_stops_uncertain_then_reconciled_completes_with_one_effect(
    tmp_path: Path, charge_provider: ProviderStandIn
) -> None:
    """(a) SIGKILL after the charge's effect: the resumed pass stops (exit 3) with the reconcile command and
    runs no tool; the operator reconciles from the CLI; the next pass completes, a later one replays it;
    one charge in all, each model step billed once."""
    url, calls = charge_provider.url, tmp_path / "calls.log"
    assert -signal.SIGKILL == one_pass(tmp_path, url, "die-in-tool").returncode
    resumed = one_pass(tmp_path, url, "live")
    assert ExitStatus.STOPPED_UNCERTAIN == resumed.returncode, resumed.stderr
    assert resumed.stderr.startswith("UncertainEffect: ")  # not the SDK's UserError
    command = resumed.stderr.split("Reconcile it with evidence: ", 1)[1].strip()
    expected = f"effectlog reconcile --journal {tmp_path / 'runs.db'} --run-id {RUN} --step tool-1-call_0 --attempt 1 "
    assert command.startswith(expected)
    assert 1 == len(keys(calls, "effect"))
    reconciled = cli(
        "reconcile", "--journal", str(tmp_path / "runs.db"), "--run-id", RUN, "--step", "tool-1-call_0",
        "--outcome", "applied", "--evidence", "charge ch_1 found at the bank", "--operator", "ann",
    )  # fmt: skip
    assert 0 == reconciled.returncode, reconciled.stderr
    assert {"output": "done"} == output(one_pass(tmp_path, url, "live"))
    assert {"output": "done"} == output(one_pass(tmp_path, url, "live"))  # completed: replayed, nothing called
    assert 1 == len(keys(calls, "effect"))
    billed_once_per_step(charge_provider)
    assert 0 == charge_provider.replayed  # the recorded model-0 was never asked again


def test_killed_inside_an_idempotent_tool_resends_with_the_same_key(tmp_path: Path) -> None:
    """(b) SIGKILL after the lookup's effect: the resumed pass re-sends it with the same idempotency key
    (so a service deduplicating by key applies it once) and completes."""
    provider = ProviderStandIn(LOOKUP).start()
    try:
        assert -signal.SIGKILL == one_pass(tmp_path, provider.url, "die-in-tool").returncode
        assert {"output": "done"} == output(one_pass(tmp_path, provider.url, "live"))
    finally:
        provider.stop()
    effect_keys = keys(tmp_path / "calls.log", "effect")
    assert 2 == len(effect_keys)
    assert 1 == len(set(effect_keys))  # the same key both times: one effect at a key-honouring service
    billed_once_per_step(provider)


def test_killed_while_a_model_request_is_in_flight_bills_each_model_step_once(tmp_path: Path) -> None:
    """(c) SIGKILL while model-0 is in flight (the provider billed it, its answer not yet back): the
    resumed pass re-sends it under the same Idempotency-Key, the provider answers from its record;
    each of the two model steps billed once; a third pass makes no request."""
    stall = threading.Event()
    provider = ProviderStandIn(CHARGE, stall=stall).start()
    try:
        argv, env = child(tmp_path, provider.url, "live")
        first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 120  # the child imports the agents SDK: slow on a loaded machine
        while provider.billed == 0:
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first pass sent no model request in 120 s"
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
        stall.set()
        assert -signal.SIGKILL == first.returncode
        assert {"output": "done"} == output(one_pass(tmp_path, provider.url, "live"))
        assert {"output": "done"} == output(one_pass(tmp_path, provider.url, "live"))
    finally:
        stall.set()
        provider.stop()
    assert (2, 1, 3) == (provider.billed, provider.replayed, provider.requests)
    first_key, resent, final = (str(k) for k in provider.keys_seen)
    assert first_key == resent
    assert [f"{RUN}/model-0/", f"{RUN}/model-1/"] == [first_key[: len(RUN) + 9], final[: len(RUN) + 9]]
    assert 1 == len(keys(tmp_path / "calls.log", "effect"))


def test_approval_held_approved_from_the_cli_while_the_app_is_not_running_then_executed_once(
    tmp_path: Path, charge_provider: ProviderStandIn
) -> None:
    """A charge needing approval: the pass ends with the SDK's interruption for the call and effectlog's
    approve command, nothing charged; a person approves from the CLI; the next pass charges once; a
    third, never."""
    url, calls = charge_provider.url, tmp_path / "calls.log"
    held = output(one_pass(tmp_path, url, "approve"))
    assert ["call_0"] == held["interruptions"]
    [waiting] = held["held"]  # type: ignore[misc]
    step, command = waiting["step_id"], waiting["command"]
    assert command.startswith(f"effectlog approve --journal {tmp_path / 'runs.db'} --run-id {RUN} --step {step} ")
    assert [] == keys(calls, "effect")
    status = cli("status", "--journal", str(tmp_path / "runs.db"), "--run-id", RUN)
    assert f"run {RUN}: suspended" == status.stdout.splitlines()[0].split(" (")[0]
    approved = cli("approve", "--journal", str(tmp_path / "runs.db"), "--run-id", RUN, "--step", step, "--by", "ann")
    assert 0 == approved.returncode, approved.stderr
    assert {"output": "done"} == output(one_pass(tmp_path, url, "approve"))
    assert {"output": "done"} == output(one_pass(tmp_path, url, "approve"))
    assert 1 == len(keys(calls, "effect"))
    billed_once_per_step(charge_provider)


def test_a_changed_prompt_on_resume_is_refused_before_anything_runs(
    tmp_path: Path, charge_provider: ProviderStandIn
) -> None:
    """Divergence: a pass that asks the recorded model step with another prompt exits 5 (conflict) naming
    the step; no model request and no tool call is made."""
    url, calls = charge_provider.url, tmp_path / "calls.log"
    assert -signal.SIGKILL == one_pass(tmp_path, url, "die-in-tool").returncode
    before = (charge_provider.requests, len(keys(calls, "effect")))
    diverged = one_pass(tmp_path, url, "live", prompt="charge bob 500")
    assert ExitStatus.CONFLICT == diverged.returncode, diverged.stderr
    assert diverged.stderr.startswith("IdempotencyConflict: ")
    assert "step 'model-0'" in diverged.stderr
    assert before == (charge_provider.requests, len(keys(calls, "effect")))


def test_killed_in_the_second_of_two_parallel_calls_keeps_the_first_and_doubts_only_the_second(
    tmp_path: Path,
) -> None:
    """Parallel calls (lookup, then charge) in one response, SIGKILL after the charge's effect: the resumed
    pass replays the lookup from the journal (not called again), stops uncertain on the charge alone;
    reconciled, the run completes with one lookup and one charge."""
    script: list[Reply] = [[("lookup", {"to": "bob", "amount": 5}), ("charge", {"to": "bob", "amount": 5})], "done"]
    provider = ProviderStandIn(script).start()
    calls = tmp_path / "calls.log"
    try:
        assert -signal.SIGKILL == one_pass(tmp_path, provider.url, "die-in-charge").returncode
        resumed = one_pass(tmp_path, provider.url, "live")
        assert ExitStatus.STOPPED_UNCERTAIN == resumed.returncode, resumed.stderr
        assert "--step tool-1-call_0_1 " in resumed.stderr
        assert 2 == len(keys(calls, "effect"))  # the lookup and the charge, each once so far
        reconciled = cli(
            "reconcile", "--journal", str(tmp_path / "runs.db"), "--run-id", RUN, "--step", "tool-1-call_0_1",
            "--outcome", "applied", "--evidence", "charge ch_1 found at the bank", "--operator", "ann",
        )  # fmt: skip
        assert 0 == reconciled.returncode, reconciled.stderr
        assert {"output": "done"} == output(one_pass(tmp_path, provider.url, "live"))
    finally:
        provider.stop()
    assert 2 == len(keys(calls, "effect"))
    billed_once_per_step(provider)
