"""Tools that misbehave after their effect: the step's outcome is unknown, never a silent success.

Every case is a real ``effectlog run`` process with a user adapter module that first writes
its effect (a line in ledger.txt naming the step and the idempotency key) and then
misbehaves: ``sys.exit(0)``, ``os._exit(0)``, ``KeyboardInterrupt``, a bare
``BaseException``, or a result the journal cannot encode. By contract a step that is not
idempotent is then uncertain and the run stopped (exit 3); an idempotent one is re-sent with
the same key and fails when its sends run out (exit 1). A tool's own stdout never reaches
effectlog's stdout.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hardening_kit import SAFETY_TIMEOUT_S, cli_env, last_line

TOOLS = """
import os
import subprocess
import sys


def _self_referencing():
    d = {}
    d["self"] = d
    return d


def _generator():
    yield 1


def _keyboard():
    raise KeyboardInterrupt


def _base():
    raise BaseException("odd")


def _stop_iteration():
    raise StopIteration("no more")


def _chatty():
    print("tool chatter")
    sys.stdout.flush()
    os.write(1, b"raw chatter\\n")
    subprocess.run(["sh", "-c", "echo child chatter"], check=True)
    return {"ok": True}


BEHAVIOURS = {
    "sys.exit": lambda: sys.exit(0),
    "os._exit": lambda: os._exit(0),
    "keyboard": _keyboard,
    "base-exception": _base,
    "stop-iteration": _stop_iteration,
    "object": lambda: {"x": object()},
    "set-mixed": lambda: {"ids": {1, "a"}},
    "tuple-key": lambda: {(1, 2): "pair"},
    "self-referencing": _self_referencing,
    "lone-surrogate": lambda: {"name": "\\ud800"},
    "generator": _generator,
    "chatty": _chatty,
    "quiet": lambda: {"ok": True},
}


class Misbehaving:
    def __init__(self, options):
        self.mode = options["mode"]
        self.blocking = options.get("blocking", True)

    def invoke(self, request):
        with open("ledger.txt", "a") as fh:
            fh.write(f"{request.step_id} {request.idempotency_key}\\n")
        return BEHAVIOURS[self.mode]()


ADAPTERS = {"misbehaving": lambda decl, ctx: Misbehaving(decl.options)}
"""

# What the error line (the last on stderr, after the progress lines) must say about each misbehaviour.
SAID = {
    "sys.exit": "the tool called sys.exit(0)",
    "base-exception": "the tool raised BaseException: odd",
    "stop-iteration": "the tool raised StopIteration: no more",  # a future cannot carry it
    "object": "result.x: a value of type object",
    "set-mixed": "result.ids: a set mixing int and str",
    "tuple-key": "result: a dict key of type tuple",
    "self-referencing": "result.self: a self-referencing dict",
    "lone-surrogate": "result.name: a str with a lone surrogate",
    "generator": "result: a value of type generator",
}


ADAPTERS_FLAG = ("--adapters", "misbehave_tools:ADAPTERS")


class Tools:
    """A directory with the misbehaving tools module, a plan, and ``effectlog`` to run in it."""

    def __init__(self, where: Path) -> None:
        self.dir = where
        (where / "misbehave_tools.py").write_text(TOOLS)
        self.env = cli_env({"PYTHONPATH": str(where)})

    def plan(self, mode: str, *, idempotent: bool = False, blocking: bool = True, sends: int = 1) -> str:
        tool: dict[str, Any] = {
            "type": "misbehaving",
            "idempotent": idempotent,
            "options": {"mode": mode, "blocking": blocking},
        }
        pay: dict[str, Any] = {"id": "pay", "adapter": "tool"}
        if sends > 1:
            pay["retry"] = {"attempts": sends, "backoff_base_s": 0, "backoff_cap_s": 0}
        plan = {
            "run_id": "r",
            "adapters": {"tool": tool, "after": {"type": "noop"}},
            "steps": [pay, {"id": "notify", "adapter": "after"}],
        }
        (self.dir / "plan.json").write_text(json.dumps(plan))
        return "plan.json"

    def effectlog(self, *argv: str, stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "effectlog", *argv],
            cwd=self.dir,
            env=self.env,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=SAFETY_TIMEOUT_S,
            check=False,
        )

    def run(self, *extra: str) -> subprocess.CompletedProcess[str]:
        return self.effectlog("run", "plan.json", "--journal", "j.db", *ADAPTERS_FLAG, *extra)

    def ledger(self) -> list[str]:
        path = self.dir / "ledger.txt"
        return path.read_text().splitlines() if path.exists() else []

    def status(self) -> dict[str, Any]:
        done = self.effectlog("status", "--journal", "j.db", "--run-id", "r", "--json")
        assert 0 == done.returncode, done.stderr
        status: dict[str, Any] = json.loads(done.stdout)
        return status


@pytest.fixture
def tools(tmp_path: Path) -> Tools:
    return Tools(tmp_path)


def _steps(status: dict[str, Any]) -> list[tuple[str, str]]:
    return [(s["id"], s["state"]) for s in status["steps"]]


@pytest.mark.parametrize("blocking", [True, False], ids=["thread", "inline"])
@pytest.mark.parametrize("mode", sorted(SAID))
def test_a_tool_that_exits_raises_base_exception_or_returns_the_unencodable_leaves_its_step_uncertain(
    tools: Tools, mode: str, blocking: bool
) -> None:
    """Not idempotent: the effect happened once and its outcome is unknown to effectlog, so the
    step is uncertain, the run stopped (exit 3), stderr ends with one error line naming the step and what
    went wrong (the type that could not be encoded), later steps never run; running the plan
    again stops again without a second send."""
    tools.plan(mode, blocking=blocking)

    first = tools.run()
    line = last_line(first.stderr)
    again = tools.run()

    assert (3, True, True) == (first.returncode, "step 'pay'" in line, SAID[mode] in line), line
    assert ("stopped", [("pay", "uncertain")]) == (tools.status()["state"], _steps(tools.status()))
    assert 3 == again.returncode, again.stderr
    assert 1 == len(tools.ledger())


@pytest.mark.parametrize("mode", ["sys.exit", "object", "self-referencing"])
def test_an_idempotent_tool_that_misbehaves_is_re_sent_with_the_same_key_then_fails(tools: Tools, mode: str) -> None:
    """Idempotent with three sends: each send is recorded, re-sent with the same key, and when
    the sends run out the step fails (exit 1), stderr ending with one line naming the step and the cause."""
    tools.plan(mode, idempotent=True, sends=3)

    done = tools.run()
    line = last_line(done.stderr)

    assert (1, True, True) == (done.returncode, "step 'pay'" in line, SAID[mode] in line), line
    assert ("failed", [("pay", "failed")]) == (tools.status()["state"], _steps(tools.status()))
    assert 3 == len(tools.ledger())
    assert 1 == len({entry.split()[1] for entry in tools.ledger()})


@pytest.mark.parametrize("blocking", [True, False], ids=["thread", "inline"])
def test_a_keyboard_interrupt_inside_a_tool_that_is_not_idempotent_is_an_uncertain_step(
    tools: Tools, blocking: bool
) -> None:
    """KeyboardInterrupt raised by the tool is an interruption of the tool, not a clean stop
    after a commit: the step is uncertain and the run stopped (exit 3), not exit 130 with the
    step left requested."""
    tools.plan("keyboard", blocking=blocking)

    done = tools.run()
    line = last_line(done.stderr)

    assert (3, True) == (done.returncode, "KeyboardInterrupt" in line), line
    assert ("stopped", [("pay", "uncertain")]) == (tools.status()["state"], _steps(tools.status()))
    assert 1 == len(tools.ledger())


def test_a_keyboard_interrupt_inside_an_idempotent_tool_stops_without_re_sending_until_run_again(
    tools: Tools,
) -> None:
    """Idempotent: nothing is re-sent in the interrupted process (exit 130, the step stays
    requested, the run open); running the plan again re-sends the same key."""
    tools.plan("keyboard", idempotent=True, sends=3)

    first = tools.run()
    line = last_line(first.stderr)
    sent_once = len(tools.ledger())
    state = tools.status()
    tools.run()

    assert (130, True) == (first.returncode, "interrupted inside step 'pay'" in line), line
    assert (1, "running", [("pay", "requested")]) == (sent_once, state["state"], _steps(state))
    assert 2 == len(tools.ledger())
    assert 1 == len({entry.split()[1] for entry in tools.ledger()})


@pytest.mark.parametrize("blocking", [True, False], ids=["thread", "inline"])
def test_os_exit_inside_a_tool_kills_the_process_and_the_next_run_finds_the_step_uncertain(
    tools: Tools, blocking: bool
) -> None:
    """``os._exit(0)`` ends the process like SIGKILL: the step is left requested; the next run
    finds it uncertain (not idempotent), stops with exit 3 naming it, and sends nothing."""
    tools.plan("os._exit", blocking=blocking)

    killed = tools.run()
    left = tools.status()
    resumed = tools.run()
    line = last_line(resumed.stderr)

    assert [("pay", "requested")] == _steps(left)
    assert (3, True) == (resumed.returncode, "step 'pay'" in line), (killed.stderr, line)
    assert ("stopped", [("pay", "uncertain")]) == (tools.status()["state"], _steps(tools.status()))
    assert 1 == len(tools.ledger())


@pytest.mark.parametrize("blocking", [True, False], ids=["thread", "inline"])
def test_a_tool_writing_to_stdout_never_mixes_with_run_json(tools: Tools, blocking: bool) -> None:
    """``print``, a raw write to fd 1 and a child process's output all go to stderr while the
    tool runs; stdout holds exactly the one JSON object of ``run --json``."""
    tools.plan("chatty", blocking=blocking)

    done = tools.run("--json")

    assert (0, "completed") == (done.returncode, json.loads(done.stdout)["state"]), done.stderr
    assert ["tool chatter", "raw chatter", "child chatter"] == [
        line for line in done.stderr.splitlines() if "chatter" in line
    ]


def test_run_json_of_a_stopped_run_carries_the_reconcile_command(tools: Tools) -> None:
    """``run --json`` of a stopped run has ``reconcile_command``, the exact command the run
    needs next; with the outcome filled in, it resolves the step."""
    tools.plan("object")

    done = tools.run("--json")
    command = json.loads(done.stdout)["reconcile_command"]
    argv = command.split()[1:]
    argv = [{"applied|not-applied": "applied", "TEXT": "ledger.txt", "NAME": "ana"}.get(a, a) for a in argv]
    reconciled = tools.effectlog(*argv)

    expected = "effectlog reconcile --journal j.db --run-id r --step pay --attempt 1 "
    assert (3, True) == (done.returncode, command.startswith(expected)), command
    assert 0 == reconciled.returncode, reconciled.stderr
    assert [("pay", "reconciled")] == _steps(tools.status())


@pytest.mark.parametrize("stderr_too", [False, True], ids=["stdout", "stdout-and-stderr"])
@pytest.mark.parametrize(("mode", "status"), [("object", 3), ("quiet", 0)])
def test_a_closed_stdout_keeps_the_exit_status(tools: Tools, mode: str, status: int, stderr_too: bool) -> None:
    """``effectlog run ... | head -0`` (and ``2>&1 | head -0``): the reader is gone before
    effectlog writes; the exit status is still the run's (3 stays 3, 0 stays 0) and nothing is
    said about the pipe."""
    tools.plan(mode)
    proc = subprocess.Popen(
        [sys.executable, "-m", "effectlog", "run", "plan.json", "--journal", "j.db", *ADAPTERS_FLAG],
        cwd=tools.dir,
        env=tools.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if stderr_too else subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # the reader goes away at once
    stderr = "" if proc.stderr is None else proc.stderr.read()
    proc.wait(timeout=SAFETY_TIMEOUT_S)

    assert status == proc.returncode, stderr
    assert [] == [w for w in ("Traceback", "BrokenPipe", "Exception ignored") if w in stderr], stderr
