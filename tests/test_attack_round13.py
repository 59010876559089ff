"""Attack round 13: the run's life cycle under real crashes, and the integrations' "paid once".

Retry, fork and recover each killed with a real SIGKILL (a child process that kills itself
at a crash point the crash matrix uses), chains of them (a retry of a fork of a retry, a
fork of a parent whose key a retry already sent again), the agent integrations killed
between a recorded model answer and its tools, and the hash-chained trace across a kill and
a resume. Effects are counted in the effect store itself and model calls on the local
stand-in provider; every journal is checked with ``effectlog verify``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from effectlog import events as ev
from effectlog.errors import EffectlogError, ExitStatus
from effectlog.journal import open_journal
from effectlog.plan import parse_plan
from effectlog.runtime import Runtime
from effectlog.testing import sample_run
from effectlog.trace import verify_trace
from hardening_kit import SAFETY_TIMEOUT_S, cli_env
from lifecycle_adapters import ADAPTERS
from test_fork_stores_and_keys import lossy
from test_lifecycle import effect_counts
from test_trace import write_trace

HERE = Path(__file__).parent

# A child that does one life-cycle operation and SIGKILLs itself when the runtime reaches a crash
# point (the crash matrix's names: ``after_effect``, ``before_commit:<event tag>``, ...).
CHILD = """
import json, os, signal, sys
from effectlog.errors import EffectlogError
from effectlog.plan import parse_plan
from effectlog.runtime import Runtime
from lifecycle_adapters import ADAPTERS

journal, effects, op, kill, arg = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
point, _, step = kill.partition("@")


def hook(where, sid):
    if point and where == point and (not step or sid == step):
        os.kill(os.getpid(), signal.SIGKILL)


try:
    with Runtime(journal, effects=effects, adapters=ADAPTERS, crash_hook=hook) as rt:
        if op == "run":
            out = rt.run(parse_plan(json.dumps(arg).encode()))
        elif op == "retry":
            out = rt.retry(arg, by="ops", reason="again")
        elif op == "fork":
            out = rt.fork(arg[0], arg[1], by="ops", reason="on purpose")
        else:
            print(json.dumps([[r.run_id, r.state] for r in rt.recover()]))
            sys.exit(0)
except EffectlogError as exc:
    print(f"{exc.code}: {exc}", file=sys.stderr)
    sys.exit(int(exc.exit_status))
print(json.dumps([out.run_id, out.state]))
"""


def child(journal: Path, effects: Path, op: str, arg: Any = None, kill: str = "") -> subprocess.CompletedProcess[str]:
    """One life-cycle operation in a real child process, killed (SIGKILL) at ``kill`` if it gets there."""
    env = {**cli_env(), "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), str(HERE)])}
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(journal), str(effects), op, kill, json.dumps(arg)],
        env=env, capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S,
    )  # fmt: skip


def verify(journal: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectlog", "verify", "--journal", str(journal)],
        env=cli_env(), capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S,
    )  # fmt: skip


# -- the hash-chained trace across a crash ---------------------------------------------------------------


def test_a_trace_whose_last_record_lost_its_newline_is_extended_into_a_chain_that_still_verifies(
    tmp_path: Path,
) -> None:
    """A trace file whose last record has no newline after it (a copy, an editor, a crash between the
    record and its newline on a filesystem that tears writes) verifies; a resumed run tracing into it
    wrote its first record on the same line, so the file that verified before no longer did (the
    glued line is "not a trace record"). Proves: extending such a file starts the record on a new
    line, and every record, old and new, verifies."""
    path = tmp_path / "trace.jsonl"
    history = sample_run("r", steps=2)
    write_trace(path, history[:3])
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    assert (3, None, "") == verify_trace(path)
    write_trace(path, history[3:])
    assert (len(history), None, "") == verify_trace(path)


def test_verify_trace_names_a_last_record_cut_mid_write_as_torn_not_as_an_edit(tmp_path: Path) -> None:
    """A trace whose last line is a record cut short (the machine died mid-write) was reported with the
    words an edited line gets ("not a trace record"), so a reader could not tell a crash from tampering.
    Proves: the same line number and count, and a reason that says the file ends inside a record; a
    broken line in the middle keeps its old reason."""
    path = tmp_path / "trace.jsonl"
    write_trace(path, sample_run("r", steps=1))
    whole = path.read_bytes()
    path.write_bytes(whole[:-20])
    count, line, reason = verify_trace(path)
    assert (len(whole.splitlines()) - 1, len(whole.splitlines())) == (count, line)
    assert reason.startswith("torn: the file ends inside a record"), reason
    path.write_bytes(whole[:-20] + b"\n" + whole.splitlines(keepends=True)[-1])
    assert (len(whole.splitlines()) - 1, len(whole.splitlines()), "not a trace record") == verify_trace(path)


# -- retry / fork / recover, killed between their commits ---------------------------------------------------


def _lifecycle(tmp: Path, op: str, arg: Any = None, kill: str = "") -> subprocess.CompletedProcess[str]:
    return child(tmp / "j.db", tmp / "e.db", op, arg, kill)


@pytest.mark.parametrize("kill", ["before_commit:run.started", "after_effect@reserve"])
def test_a_retry_killed_between_its_commits_is_finished_once_and_never_retried_twice(tmp_path: Path, kill: str) -> None:
    """The parent's idempotent `reserve` lost every answer; its retry re-sends the parent's key and is
    SIGKILLed (before its first commit, or after the re-sent key's effect, before its answer is journaled).

    Proves: killed before its first commit, the retry left nothing (its turn and claim died with it)
    and the next retry runs; killed after it, a second retry is refused (exit 5: the fork exists)
    and ``recover`` finishes the fork. Either way one reservation and one log, the fork's `reserve`
    under the parent's key, and ``effectlog verify`` ok.
    """
    plan = lossy(tmp_path)
    assert 0 == _lifecycle(tmp_path, "run", msgspec.to_builtins(plan)).returncode
    (tmp_path / "answers").touch()
    assert -9 == _lifecycle(tmp_path, "retry", "book-1", kill).returncode
    again = _lifecycle(tmp_path, "retry", "book-1")
    if kill == "before_commit:run.started":
        assert (0, ["book-1.retry1", "completed"]) == (again.returncode, json.loads(again.stdout)), again.stderr
    else:
        assert ExitStatus.CONFLICT == again.returncode, again.stderr
        assert "already forked as book-1.retry1" in again.stderr
        recovered = _lifecycle(tmp_path, "recover")
        assert [["book-1.retry1", "completed"]] == json.loads(recovered.stdout), recovered.stderr
    assert Counter({("book-1", "reserve"): 1, ("book-1.retry1", "log"): 1}) == effect_counts(tmp_path / "e.db")
    with Runtime(str(tmp_path / "j.db"), effects=tmp_path / "e.db", adapters=ADAPTERS) as rt:
        keys = {rt.load(r).step("reserve").idempotency_key for r in ("book-1", "book-1.retry1")}
    assert 1 == len(keys)
    checked = verify(tmp_path / "j.db")
    assert 0 == checked.returncode, checked.stdout + checked.stderr


def test_a_retry_of_a_fork_of_a_retry_each_killed_sends_one_key_and_makes_one_reservation(tmp_path: Path) -> None:
    """A chain: the parent loses `reserve`'s answers; its retry is SIGKILLed after recording the re-send
    and recovered (answers still lost: it fails); that retry is forked (fails too); the answers come back
    and the fork's retry is SIGKILLed after the effect, then recovered.

    Proves: four runs, one key for `reserve` in all of them (each ``key_from`` naming the run it
    was forked from), one reservation and one log in the effect store, each run retried once
    (a second retry of a forked run is refused, exit 5), and ``effectlog verify`` ok.
    """
    plan = lossy(tmp_path)
    assert 0 == _lifecycle(tmp_path, "run", msgspec.to_builtins(plan)).returncode
    assert -9 == _lifecycle(tmp_path, "retry", "book-1", "after_resend@reserve").returncode
    assert [["book-1.retry1", "failed"]] == json.loads(_lifecycle(tmp_path, "recover").stdout)
    forked = _lifecycle(tmp_path, "fork", ["book-1.retry1", "F"])
    assert (0, ["F", "failed"]) == (forked.returncode, json.loads(forked.stdout)), forked.stderr
    (tmp_path / "answers").touch()
    assert -9 == _lifecycle(tmp_path, "retry", "F", "after_effect@reserve").returncode
    assert [["F.retry1", "completed"]] == json.loads(_lifecycle(tmp_path, "recover").stdout)
    for parent in ("book-1", "book-1.retry1", "F"):
        assert ExitStatus.CONFLICT == _lifecycle(tmp_path, "retry", parent).returncode
    assert Counter({("book-1", "reserve"): 1, ("F.retry1", "log"): 1}) == effect_counts(tmp_path / "e.db")
    runs = ("book-1", "book-1.retry1", "F", "F.retry1")
    j = open_journal(str(tmp_path / "j.db"), writer=False)
    try:
        sent = {
            r: [(e.idempotency_key, e.key_from) for e in map(ev.decode, (x.body for x in j.read(r)))
                if isinstance(e, ev.StepRequested) and e.step_id == "reserve"]
            for r in runs
        }  # fmt: skip
    finally:
        j.close()
    key = sent["book-1"][0][0]
    assert {
        "book-1": [(key, "")],
        "book-1.retry1": [(key, "book-1")],
        "F": [(key, "book-1.retry1")],
        "F.retry1": [(key, "F")],
    } == sent
    checked = verify(tmp_path / "j.db")
    assert 0 == checked.returncode, checked.stdout + checked.stderr


# -- the agent integrations: a model answer paid for once ---------------------------------------------------

AGENT_CHILD = """
import json, os, signal, sys
from pathlib import Path
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel
from effectlog.errors import EffectlogError
from effectlog.integrations.pydantic_ai import DurableAgent, idempotency_key
from session_kit import note

journal, calls, die = sys.argv[1], Path(sys.argv[2]), sys.argv[3]


def model(messages, info):
    note(calls, "model " + (info.model_settings or {}).get("extra_headers", {}).get("Idempotency-Key", ""))
    if not any(isinstance(m, ModelResponse) for m in messages):
        return ModelResponse(parts=[
            ToolCallPart("lookup", {"who": "bob"}, tool_call_id="a"),
            ToolCallPart("charge", {"who": "bob"}, tool_call_id="b"),
            ToolCallPart("lookup", {"who": "cy"}, tool_call_id="c"),
        ])
    return ModelResponse(parts=[TextPart("done")])


agent = Agent(FunctionModel(model), output_type=str)


@agent.tool_plain
def lookup(who: str) -> str:
    note(calls, "lookup " + idempotency_key())
    if die == "lookup-" + who:
        os.kill(os.getpid(), signal.SIGKILL)
    return "found " + who


@agent.tool_plain
def charge(who: str) -> str:
    note(calls, "charge " + idempotency_key())
    if die == "charge":
        os.kill(os.getpid(), signal.SIGKILL)
    return "charged " + who


try:
    print(json.dumps(DurableAgent(agent, journal=journal, idempotent={"lookup"}).run_sync("go", run_id="r").output))
except EffectlogError as exc:
    print(f"{exc.code}: {exc}", file=sys.stderr)
    sys.exit(int(exc.exit_status))
"""


def agent_pass(tmp: Path, die: str = "") -> subprocess.CompletedProcess[str]:
    """One pass of a pydantic-ai DurableAgent run in a real child process (SIGKILLed inside ``die``)."""
    env = {**cli_env(), "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), str(HERE)])}
    return subprocess.run(
        [sys.executable, "-c", AGENT_CHILD, str(tmp / "runs.db"), str(tmp / "calls.log"), die],
        env=env, capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S,
    )  # fmt: skip


def test_an_agent_killed_inside_one_of_three_parallel_calls_pays_its_model_once_and_runs_the_others_once(
    tmp_path: Path,
) -> None:
    """One model answer asks for three calls at once (lookup, charge, lookup); the process is SIGKILLed
    inside the charge (not idempotent), after its effect.

    Proves: the resumed pass asks the model nothing (its answer is journaled), runs neither
    lookup's tool again before it stops on the uncertain charge (exit 3); once the charge is
    reconciled from the CLI, the next pass calls the model once more (the next turn) and runs the
    last lookup once; the model paid twice in all (two turns, two keys), the charge made once.
    """
    calls = tmp_path / "calls.log"
    assert -9 == agent_pass(tmp_path, "charge").returncode
    first = Counter(line.split(" ")[0] for line in calls.read_text().splitlines())
    resumed = agent_pass(tmp_path)
    assert ExitStatus.STOPPED_UNCERTAIN == resumed.returncode, resumed.stderr
    assert first == Counter(line.split(" ")[0] for line in calls.read_text().splitlines())
    reconciled = subprocess.run(
        [sys.executable, "-m", "effectlog", "reconcile", "--journal", str(tmp_path / "runs.db"), "--run-id", "r",
         "--step", "tool-1-b", "--outcome", "applied", "--evidence", "the bank shows it", "--operator", "ann"],
        env=cli_env(), capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S,
    )  # fmt: skip
    assert 0 == reconciled.returncode, reconciled.stderr
    done = agent_pass(tmp_path)
    assert (0, '"done"') == (done.returncode, done.stdout.strip()), done.stderr
    lines = calls.read_text().splitlines()
    models = [line.split(" ")[1] for line in lines if line.startswith("model ")]
    assert (2, 2) == (len(models), len(set(models)))
    assert Counter({"model": 2, "lookup": 2, "charge": 1}) == Counter(line.split(" ")[0] for line in lines)


def test_an_agent_killed_inside_the_last_of_three_parallel_calls_resends_only_that_one_under_its_key(
    tmp_path: Path,
) -> None:
    """The same three calls, SIGKILLed inside the last lookup (idempotent) after its effect.

    Proves: the resumed pass completes, asking the model only for the next turn; the charge is
    not run again; the killed lookup is sent again under the same key (so a service keyed on it
    answers it once) and the first lookup is not sent again.
    """
    calls = tmp_path / "calls.log"
    assert -9 == agent_pass(tmp_path, "lookup-cy").returncode
    done = agent_pass(tmp_path)
    assert (0, '"done"') == (done.returncode, done.stdout.strip()), done.stderr
    lines = calls.read_text().splitlines()
    assert Counter({"model": 2, "lookup": 3, "charge": 1}) == Counter(line.split(" ")[0] for line in lines)
    lookups = [line.split(" ")[1] for line in lines if line.startswith("lookup ")]
    assert (lookups[1], 2) == (lookups[2], len(set(lookups)))
    models = [line.split(" ")[1] for line in lines if line.startswith("model ")]
    assert 2 == len(set(models))


# -- a timeout ends the wait, not the call ----------------------------------------------------------------


class _Late:
    """A non-idempotent tool whose first call answers late (when the test releases it), making its effect
    then, as a slow remote service would; later calls answer at once. ``lookup`` reads the effect store,
    as a truthful service would: it says what has landed so far."""

    def __init__(self, ctx: Any) -> None:
        self.store = ctx.effect_store()

    def invoke(self, request: Any) -> Any:
        LATE_CALLS.append(threading.current_thread())
        if len(LATE_CALLS) == 1:
            RELEASE.wait(SAFETY_TIMEOUT_S)
        return self.store.apply_control(request)

    def lookup(self, request: Any) -> Any:
        return self.store.lookup(request)


LATE_CALLS: list[threading.Thread] = []
RELEASE = threading.Event()


@pytest.fixture
def late_released() -> Iterator[None]:
    """``_Late``'s first call held until the test sets ``RELEASE``; released and joined after the test."""
    LATE_CALLS.clear()
    RELEASE.clear()
    yield None
    RELEASE.set()
    for thread in LATE_CALLS:
        thread.join(SAFETY_TIMEOUT_S)


def test_a_lookup_while_the_timed_out_call_is_still_running_in_this_process_does_not_start_a_second_effect(
    tmp_path: Path,
) -> None:
    """A non-idempotent step's tool does not answer within ``timeout_s``: the run stops uncertain (right),
    but the call goes on in its thread in this process (a long-lived runtime: an app, a fleet runner).

    ``reconcile_by_lookup`` asks the tool's own lookup while that call is still in flight: "no
    effect for this attempt" is recorded as not applied, the next run makes attempt 2's effect, and
    then the first call lands: two effects, the journal saying one. Proves (when fixed): while this
    process still runs the attempt's call, its absence from a ledger is no evidence (the lookup is
    refused, or the resume waits for the call), and the effect is made once.
    """
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    plan = parse_plan(
        json.dumps(
            {
                "run_id": "pay-1",
                "adapters": {"bank": {"type": "test.late"}},
                "steps": [{"id": "pay", "adapter": "bank", "args": {"n": 1}, "timeout_s": 0.2}],
            }
        ).encode()
    )
    adapters = {"test.late": lambda decl, ctx: _Late(ctx)}
    LATE_CALLS.clear()
    RELEASE.clear()
    try:
        with Runtime(str(journal), effects=effects, adapters=adapters) as rt:
            assert "stopped" == rt.run(plan).state
            with contextlib.suppress(EffectlogError):  # refused while the call runs: the fix
                rt.reconcile_by_lookup("pay-1", "pay")
            with contextlib.suppress(EffectlogError):
                rt.run(plan)
            RELEASE.set()
            for thread in LATE_CALLS:
                thread.join(SAFETY_TIMEOUT_S)
    finally:
        RELEASE.set()
    assert Counter({("pay-1", "pay"): 1}) == effect_counts(effects)


def _billing_agent(instructions: str, system_prompt: str, tool_doc: str, calls: list[str]) -> Any:
    """A pydantic-ai agent whose one model turn asks for `charge`, whose first charge loses its answer."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    def model(messages: list[Any], info: Any) -> Any:
        calls.append("model")
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart("charge", {"who": "bob"}, tool_call_id="b")])
        return ModelResponse(parts=[TextPart("done")])

    agent: Any = Agent(FunctionModel(model), output_type=str, instructions=instructions, system_prompt=system_prompt)

    def charge(who: str) -> str:
        calls.append("charge")
        raise ConnectionError("the bank hung up")

    charge.__doc__ = tool_doc
    agent.tool_plain(charge)
    return agent


@pytest.mark.parametrize(
    "changed",
    [
        ("Bill politely.", "You bill.", "Charge."),
        ("Bill.", "You refund.", "Charge."),
        ("Bill.", "You bill.", "Refund."),
    ],
    ids=["instructions", "system-prompt", "tool-description"],
)
def test_a_resumed_agent_whose_instructions_or_tools_changed_gets_no_recorded_answer(
    tmp_path: Path, changed: tuple[str, str, str]
) -> None:
    """A pass stops after the model's answer was recorded (its tool call's outcome unknown); the next pass
    comes with other instructions, another system prompt or another tool description.

    Proves: the recorded answer, given for another conversation, is not handed to it: the pass
    is refused (``IdempotencyConflict``, exit 5) before the model or any tool is called.
    """
    from effectlog.errors import IdempotencyConflict, UncertainEffect
    from effectlog.integrations.pydantic_ai import DurableAgent

    calls: list[str] = []
    first = DurableAgent(_billing_agent("Bill.", "You bill.", "Charge.", calls), journal=str(tmp_path / "j.db"))
    with pytest.raises(UncertainEffect):
        first.run_sync("charge bob", run_id="r")
    assert ["model", "charge"] == calls
    again = DurableAgent(_billing_agent(*changed, calls), journal=str(tmp_path / "j.db"))
    with pytest.raises(IdempotencyConflict, match="model-0") as info:
        again.run_sync("charge bob", run_id="r")
    assert (ExitStatus.CONFLICT, ["model", "charge"]) == (info.value.exit_status, calls)
