"""Attack round 21: the operator's and the clock's side, with cases earlier rounds did not try.

Two people deciding one step at the same moment (approve against deny, two reconciles with other
evidence), a decision while a resume is executing the step, run ids, step keys or journal directories an
operator cannot tell apart from another one's, and the wall clock stepped back or forward between one
command and the next (libfaketime). Each test is a real process (the CLI, a durable run's program)
against real SQLite files; a race is steered by a sign the paused process gives, not a sleep.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import unicodedata
from pathlib import Path
from typing import Any

import httpx
import pytest

from effectlog import events as ev
from effectlog.journal import SqliteJournal
from hardening_kit import ROOT, SAFETY_TIMEOUT_S, cli_env, effectlog, one_line
from session_kit import count

pytest_plugins = ["pg_fixture"]

# -- 1. a run id, or a journal's directory, that is another spelling of one already there ---------------


def _durable(tmp_path: Path, journal: Path | str, run_id: str) -> tuple[int, dict[str, Any]]:
    """One pass of tests/durable_child.py (``reserve``, then the non-idempotent ``charge`` of 5, which
    notes a line in ``calls.log`` per effect) on ``run_id``: its exit status and its last line's JSON."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "durable_child.py"), str(journal), run_id,
         str(tmp_path / "calls.log"), "live", "5"],
        capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S, check=False, env=cli_env(),
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout.splitlines()[-1])


def _runs(journal: Path) -> list[str]:
    with SqliteJournal(journal, writer=False) as opened:
        return opened.runs()


NFC, NFD = unicodedata.normalize("NFC", "café-1"), unicodedata.normalize("NFD", "café-1")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param(NFC, NFD, id="decomposed-after-composed"),
        pytest.param(NFD, NFC, id="composed-after-decomposed"),
        pytest.param("order-42", "order-42 ", id="trailing-space"),
        pytest.param("order-42", "order-42\n", id="trailing-newline"),
        pytest.param("order-42", "order\u200b-42", id="zero-width-inside"),
        pytest.param("order-42", "\ufefforder-42", id="byte-order-mark"),
        pytest.param("K-42", "\u212a-42", id="kelvin-sign"),
    ],
)
def test_a_durable_run_whose_id_is_another_spelling_of_a_run_there_is_refused(
    tmp_path: Path, first: str, second: str
) -> None:
    """``durable.run(RUN_ID)`` took any non-empty text as a new run: ``café-1`` composed and decomposed,
    ``order-42`` and ``order-42 `` (a run id read with what surrounded it), or with a zero-width space or a
    byte-order mark, or ``K`` as the Kelvin sign, are two runs that every listing, ``status`` and message
    shows alike, and the program run again under the other spelling charged again (a second non-idempotent
    effect, another idempotency key). The CLI could not even name ``order-42 `` (its ``--run-id`` refuses
    surrounding spaces), so such a run could never be approved or reconciled. Proves: the second spelling
    is refused before anything is written (exit 2, the error names the run id), the charge is made once,
    and the journal holds the first run only."""
    journal = tmp_path / "runs.db"
    status, out = _durable(tmp_path, journal, first)
    assert (0, 1) == (status, count(tmp_path / "calls.log", "charge")), out
    status, out = _durable(tmp_path, journal, second)
    assert (2, "run_id_ambiguous", 1, [first]) == (
        status, out.get("error"), count(tmp_path / "calls.log", "charge"), _runs(journal)
    ), out  # fmt: skip


def test_a_durable_run_under_another_spelling_of_a_run_id_is_refused_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    """The same refusal on a PostgreSQL journal (a fleet of hosts whose programs build the run id from text
    of their own: one composed, one decomposed). Proves: the decomposed spelling is refused (exit 2,
    ``run_id_ambiguous``) and the charge is made once."""
    assert 0 == _durable(tmp_path, pg_url, NFC)[0]
    status, out = _durable(tmp_path, pg_url, NFD)
    assert (2, "run_id_ambiguous", 1) == (status, out.get("error"), count(tmp_path / "calls.log", "charge")), out


def test_an_existing_run_of_any_spelling_still_resumes(tmp_path: Path) -> None:
    """The refusal is of a *new* run only: a run already recorded under a decomposed id (by an earlier
    version, or as the first of two spellings) is resumed under that very id, its charge answered from the
    journal (exit 0, still one charge)."""
    journal = tmp_path / "runs.db"
    assert 0 == _durable(tmp_path, journal, NFD)[0]
    status, out = _durable(tmp_path, journal, NFD)
    assert (0, 1, [NFD]) == (status, count(tmp_path / "calls.log", "charge"), _runs(journal)), out


@pytest.mark.parametrize("command", ["approve", "status", "timeline"])
def test_a_run_id_given_in_another_spelling_of_the_one_recorded_is_named_as_such(tmp_path: Path, command: str) -> None:
    """A durable run recorded as ``café-1`` (composed) waits for approval; the operator types its id on a
    keyboard that makes the accent decomposed. ``approve``, ``status`` and ``timeline`` said only ``no run
    'café-1' in runs.db``, the very id ``status`` lists, shown alike. Proves: exit 2, nothing written, one
    line that names the recorded id with its code points (``ascii``) as another spelling of the one
    given."""
    journal = tmp_path / "runs.db"
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "durable_child.py"), str(journal), NFC, str(tmp_path / "calls.log"),
         "live", "500"],
        capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S, check=False, env=cli_env(),
    )  # fmt: skip
    assert 4 == done.returncode, done.stderr  # the charge of 500 waits for a person
    before = journal.read_bytes()
    argv = {
        "approve": ["approve", "--journal", str(journal), "--run-id", NFD, "--step", "charge", "--by", "ann"],
        "status": ["status", "--journal", str(journal), "--run-id", NFD],
        "timeline": ["timeline", "--journal", str(journal), "--run-id", NFD],
    }[command]
    refused = effectlog(*argv, cwd=tmp_path)
    line = one_line(refused.stderr)
    assert (2, True, True) == (refused.returncode, ascii(NFC) in line, journal.read_bytes() == before), line


def _shell_plan(path: Path, effects: Path, *, approval: bool = False, wait_for: Path | None = None) -> Path:
    """A one-step plan (run ``pay``) whose non-idempotent shell step appends a line to ``effects`` (outside
    every journal; a step sent twice shows as two lines), held for approval if ``approval``; with
    ``wait_for``, the call then waits until that file exists (a call in flight, steered by the test)."""
    script = f"echo s1 >> '{effects}'"
    if wait_for is not None:
        script += f"; i=0; while [ ! -e '{wait_for}' ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done"
    step: dict[str, Any] = {"id": "s1", "adapter": "sh", "args": {"argv": ["sh", "-c", script]}}
    if approval:
        step["approval"] = "required"
    plan = {"run_id": "pay", "adapters": {"sh": {"type": "shell", "idempotent": False}}, "steps": [step]}
    path.write_text(json.dumps(plan))
    return path


@pytest.mark.parametrize("via", ["cli", "durable"])
def test_a_new_journal_in_a_directory_spelled_as_another_directory_there_is_refused(tmp_path: Path, via: str) -> None:
    """Round 21 refused a new journal whose *name* is another Unicode spelling of a file beside it, but
    looked at the last component only: ``runs-é/j.db`` (composed) holds the run, a script's ``mkdir -p``
    made ``runs-é`` decomposed beside it, and ``--journal runs-é/j.db`` given decomposed made a new journal
    there, in which the same run sent its non-idempotent step again (both directories show alike in every
    listing). Proves: the new journal is refused before anything is made (exit 2, one line naming the
    location), the step's effect is made once, and the decomposed directory stays empty."""
    composed, decomposed = (tmp_path / unicodedata.normalize(form, "runs-é") for form in ("NFC", "NFD"))
    composed.mkdir()
    decomposed.mkdir()
    effects = tmp_path / "effects.txt"
    if via == "cli":
        plan = _shell_plan(tmp_path / "plan.json", effects)
        assert 0 == effectlog("run", "--journal", str(composed / "j.db"), str(plan), cwd=tmp_path).returncode
        again = effectlog("run", "--journal", str(decomposed / "j.db"), str(plan), cwd=tmp_path)
        assert (2, ["s1"], []) == (again.returncode, effects.read_text().split(), os.listdir(decomposed))
        assert str(decomposed / "j.db") in one_line(again.stderr)
    else:
        assert 0 == _durable(tmp_path, composed / "j.db", "order-1")[0]
        status, out = _durable(tmp_path, decomposed / "j.db", "order-1")
        assert (2, 1, []) == (status, count(tmp_path / "calls.log", "charge"), os.listdir(decomposed)), out


# -- 2. two people deciding one step at the same moment -----------------------------------------------

# ``effectlog ARGV`` as the CLI runs it, paused once its decision has read the step (the state it decides
# on): it notes DIR/reached and waits for DIR/go, so that the test runs the other decision meanwhile.
_PAUSED = r"""
import sys, time
from pathlib import Path
from effectlog import approvals, operator, reconcile
from effectlog.cli import process_main

where, load = Path(sys.argv[1]), operator.load_step

def paused(*args, **kwargs):
    found = load(*args, **kwargs)
    (where / "reached").touch()
    deadline = time.monotonic() + 180
    while not (where / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return found

approvals.load_step = reconcile.load_step = paused
sys.argv = ["effectlog", *sys.argv[2:]]
raise SystemExit(process_main())
"""


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + SAFETY_TIMEOUT_S
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.01)


def _race(tmp_path: Path, paused: list[str], meanwhile: list[str]) -> tuple[subprocess.CompletedProcess[str], ...]:
    """``effectlog PAUSED`` paused after reading the step, ``effectlog MEANWHILE`` run to its end
    meanwhile, then the first let go: both finished commands, the paused one first."""
    steer = tmp_path / "steer"
    steer.mkdir()
    script = tmp_path / "paused.py"
    script.write_text(_PAUSED)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(steer), *paused], cwd=tmp_path, env=cli_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for(steer / "reached", proc)
        other = effectlog(*meanwhile, cwd=tmp_path)
    finally:
        (steer / "go").touch()
    stdout, stderr = proc.communicate(timeout=SAFETY_TIMEOUT_S)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), other


def _events(journal: Path, run_id: str = "pay") -> list[ev.AnyEvent]:
    with SqliteJournal(journal, writer=False) as opened:
        return [ev.decode(record.body) for record in opened.read(run_id)]


def _decision(event: ev.AnyEvent) -> bool:
    """A person's approval or denial (not the hold itself, a ``step.denied`` of decision require_approval)."""
    return isinstance(event, ev.StepApproved) or (isinstance(event, ev.StepDenied) and event.decision == "deny")


PICK = ["--journal", "j.db", "--run-id", "pay", "--step", "s1"]
APPROVE = ["approve", *PICK, "--by", "ann", "--attempt", "1"]
DENY = ["deny", *PICK, "--by", "bob", "--reason", "not this one", "--attempt", "1"]


@pytest.mark.parametrize(
    ("paused", "meanwhile"), [(APPROVE, DENY), (DENY, APPROVE)], ids=["deny-first", "approve-first"]
)
def test_approve_and_deny_of_one_held_step_at_once_record_one_decision_and_the_run_acts_on_it(
    tmp_path: Path, paused: list[str], meanwhile: list[str]
) -> None:
    """Two operators decide one held step at the same moment, ``effectlog approve`` and ``effectlog deny``
    (real processes): the one that read the step first is paused there until the other has written its
    decision. Before, the loser said only ``event_conflict: run 'pay', seq 4: a different event is already
    recorded at this seq``: nothing about the step having been decided meanwhile, or by whom, or that it had
    written nothing. Proves: the journal holds exactly one decision, the winner's; the loser exits 5 with
    one line saying the step was decided meanwhile (naming that decision) and that nothing was written; the
    resumed run acts on the winner's decision (approved: the step is sent once; denied: never); ``verify``
    says ok."""
    effects = tmp_path / "effects.txt"
    plan = _shell_plan(tmp_path / "plan.json", effects, approval=True)
    assert 4 == effectlog("run", "--journal", "j.db", str(plan), cwd=tmp_path).returncode  # held
    lost, won = _race(tmp_path, paused, meanwhile)
    resumed = effectlog("run", "--journal", "j.db", str(plan), cwd=tmp_path)
    decided = [type(e).__name__ for e in _events(tmp_path / "j.db") if _decision(e)]
    approved = meanwhile[0] == "approve"
    line = one_line(lost.stderr)
    assert (0, 5, ["StepApproved" if approved else "StepDenied"]) == (won.returncode, lost.returncode, decided), line
    assert (True, True) == ("nothing was written" in line, ("approved" if approved else "denied") in line), line
    expected = (0, ["s1"]) if approved else (1, [])
    assert expected == (resumed.returncode, effects.read_text().split() if effects.exists() else []), resumed.stderr
    assert 0 == effectlog("verify", "--journal", "j.db", cwd=tmp_path).returncode


def _in_flight(tmp_path: Path, plan: Path, effects: Path) -> subprocess.Popen[str]:
    """``effectlog run`` of ``plan`` as a real process, returned once its step's call has made its effect
    (the call then waits for ``go``, as ``_shell_plan(wait_for=...)`` makes it)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "effectlog", "run", "--journal", "j.db", str(plan)], cwd=tmp_path, env=cli_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _wait_for(effects, proc)
    return proc


def test_a_decision_while_a_resume_executes_the_approved_step_is_refused(tmp_path: Path) -> None:
    """A held step is approved and the run resumed; while the resume is inside the step's call, a second
    person denies it (``deny`` accepts an approved step: a revocation before use). Proves: the deny is
    refused (exit 6, one line naming the live owner), nothing is written, the call's effect is made once
    and the resume completes the run with its result; the journal holds the approval only."""
    effects, go = tmp_path / "effects.txt", tmp_path / "go"
    plan = _shell_plan(tmp_path / "plan.json", effects, approval=True, wait_for=go)
    assert 4 == effectlog("run", "--journal", "j.db", str(plan), cwd=tmp_path).returncode
    assert 0 == effectlog(*APPROVE, cwd=tmp_path).returncode
    resume = _in_flight(tmp_path, plan, effects)
    try:
        denied = effectlog(*DENY, cwd=tmp_path)
    finally:
        go.touch()
    resume.communicate(timeout=SAFETY_TIMEOUT_S)
    decided = [type(e).__name__ for e in _events(tmp_path / "j.db") if _decision(e)]
    assert (6, 0, ["s1"], ["StepApproved"]) == (
        denied.returncode, resume.returncode, effects.read_text().split(), decided
    ), denied.stderr  # fmt: skip
    assert "driven by" in one_line(denied.stderr)


RECONCILE = ["reconcile", *PICK, "--attempt", "1"]
APPLIED = [*RECONCILE, "--outcome", "applied", "--evidence", "psp: charge ch_1 found", "--operator", "ann"]
NOT_APPLIED = [*RECONCILE, "--outcome", "not-applied", "--evidence", "psp: no charge", "--operator", "bob"]


@pytest.mark.parametrize(
    ("paused", "meanwhile"),
    [(NOT_APPLIED, APPLIED), (APPLIED, NOT_APPLIED)],
    ids=["applied-first", "not-applied-first"],
)
def test_two_reconciles_of_one_uncertain_step_with_other_evidence_record_one(
    tmp_path: Path, paused: list[str], meanwhile: list[str]
) -> None:
    """The run is SIGKILLed inside its non-idempotent step's call (after the effect), and the resume stops
    it as uncertain. Two people reconcile it at the same moment with other evidence, one "applied", the
    other "not applied"; the one that read the step first is paused until the other has written. Were both
    recorded, or the loser's last, a step found applied could be sent again. Proves: one ``step.reconciled``
    is journaled, the winner's; the loser exits 5 (``decision_stale``, naming the reconcile written
    meanwhile); the resume acts on the winner's outcome (applied: the step is not sent again; not applied:
    sent once more, as attempt 2); ``verify`` says ok."""
    effects, go = tmp_path / "effects.txt", tmp_path / "go"
    plan = _shell_plan(tmp_path / "plan.json", effects, wait_for=go)
    killed = _in_flight(tmp_path, plan, effects)
    killed.kill()
    killed.communicate(timeout=SAFETY_TIMEOUT_S)
    go.touch()  # a resend, if any, does not wait
    assert 3 == effectlog("run", "--journal", "j.db", str(plan), cwd=tmp_path).returncode  # uncertain
    lost, won = _race(tmp_path, paused, meanwhile)
    resumed = effectlog("run", "--journal", "j.db", str(plan), cwd=tmp_path)
    reconciled = [e.outcome for e in _events(tmp_path / "j.db") if isinstance(e, ev.StepReconciled)]
    applied = "applied" in meanwhile
    line = one_line(lost.stderr)
    assert (0, 5, ["applied" if applied else "not_applied"]) == (won.returncode, lost.returncode, reconciled), line
    assert ("decision_stale", True) == (line.split(":")[1].strip(), "step.reconciled" in line), line
    assert (0, ["s1"] * (1 if applied else 2)) == (resumed.returncode, effects.read_text().split()), resumed.stderr
    assert 0 == effectlog("verify", "--journal", "j.db", cwd=tmp_path).returncode


KEY = unicodedata.normalize("NFC", "café-order")


@pytest.mark.parametrize(
    "again",
    [
        pytest.param(unicodedata.normalize("NFD", KEY), id="decomposed"),
        pytest.param(KEY + " ", id="trailing-space"),
        pytest.param("caf\u00e9\u200b-order", id="zero-width-inside"),
    ],
)
def test_a_step_key_that_is_another_spelling_of_a_recorded_step_is_refused(tmp_path: Path, again: str) -> None:
    """A session's keyed step (``session.tool(..., key=K)``) is made by a pass that then dies before the run
    finishes; the next pass (another machine, whose key is built from a decomposed file name, or read with
    a trailing space) asks for the same call under another spelling of K: a new step, its non-idempotent
    call made again under a new idempotency key, before ``finish`` could notice the step left unreached.
    Proves: the other spelling is refused (``BadInput`` naming the recorded step) before the call is made,
    and the transfer is made once; the recorded spelling still answers from the journal."""
    from effectlog.errors import BadInput
    from effectlog.session import ScriptedModel, Session, SqliteCheckpointer
    from session_kit import toolbox

    calls = tmp_path / "calls.log"
    store = SqliteCheckpointer(tmp_path / "runs.db")
    gateway = ScriptedModel([], tools=toolbox(calls, idempotent=False))

    async def one_pass(key: str) -> Any:
        session = Session("order-1", gateway, store)
        try:
            return await session.tool("transfer", {"to": "bob", "amount": 5}, key=key)
        finally:
            session.release()

    try:
        first = asyncio.run(one_pass(KEY))
        with pytest.raises(BadInput, match=f"{re.escape(ascii(KEY))}|{re.escape(repr(KEY))}"):
            asyncio.run(one_pass(again))
        assert (1, first) == (count(calls, "transfer"), asyncio.run(one_pass(KEY)))
    finally:
        store.close()


# -- 3. the wall clock stepped back or forward between one command and the next ---------------------------

# A whole-machine step (NTP correcting a VM's clock after a suspend) is seen by every process that reads
# the clock after it. Each command after the step runs under libfaketime at that offset (Debian's
# ``faketime``; ``make test`` installs it through .ci/ensure-faketime), the commands before it on the real
# clock. (Changing the offset inside a running process makes libfaketime's sleeps fail with EINVAL, so
# no process here sees the step while it runs.)
STEPS = {"back": "-1h", "forward": "+1h"}


def _faketime() -> str:
    """The ``faketime`` program; a skip where it is missing, a failure under ``CI=true``."""
    found = shutil.which("faketime")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("faketime is required when CI=true (make test installs it: .ci/ensure-faketime)", pytrace=False)
        pytest.skip("no faketime(1): apt-get install faketime")
    return found


def _effectlog_at(step: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``effectlog ARGV`` as a real process whose wall clock is stepped ``step`` (``STEPS``) from ours."""
    return subprocess.run(
        [_faketime(), "-f", STEPS[step], sys.executable, "-m", "effectlog", *argv], cwd=cwd, env=cli_env(),
        capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("step", sorted(STEPS))
def test_a_run_driven_before_the_clock_stepped_is_not_taken_by_a_process_started_after(
    tmp_path: Path, step: str
) -> None:
    """``effectlog run`` is inside its non-idempotent step's call when the wall clock steps an hour back or
    forward; a second ``effectlog run`` of the run (a retry by cron, started after the step) sees a clock
    whose "now" is before the owner's claim, or far past any lease. Were ownership a time (a lease of the
    owner's ``since``, a pid's start compared with it), the second would take the run and send the step
    again. Proves: the second run, an approve and a reconcile of the step under the stepped clock are each
    refused (exit 6, the run is driven); the step's effect is made once, the first run completes it, and
    ``verify`` says ok."""
    effects, go = tmp_path / "effects.txt", tmp_path / "go"
    plan = _shell_plan(tmp_path / "plan.json", effects, wait_for=go)
    first = _in_flight(tmp_path, plan, effects)
    try:
        again = _effectlog_at(step, "run", "--journal", "j.db", str(plan), cwd=tmp_path)
        approve = _effectlog_at(step, *APPROVE, cwd=tmp_path)
        reconcile = _effectlog_at(step, *APPLIED, cwd=tmp_path)
    finally:
        go.touch()
    first.communicate(timeout=SAFETY_TIMEOUT_S)
    assert (6, 6, 6, 0, ["s1"]) == (
        again.returncode, approve.returncode, reconcile.returncode, first.returncode, effects.read_text().split()
    ), (again.stderr, approve.stderr, reconcile.stderr)  # fmt: skip
    assert 0 == effectlog("verify", "--journal", "j.db", cwd=tmp_path).returncode


@pytest.mark.parametrize("step", sorted(STEPS))
def test_an_expiring_approval_is_used_once_whichever_way_the_clock_stepped(tmp_path: Path, step: str) -> None:
    """``approve --expires-in 600`` writes the expiry as a wall-clock time; the clock then steps before the
    run resumes. Forward an hour: the approval reads as expired, and must hold the step again rather than
    send it (the approver's ten minutes are gone by the clock every process reads). Back an hour: it reads
    as valid for 70 minutes (effectlog cannot tell a step from a wait across processes), and must still be
    used only once. Proves: forward, the resume holds the step again (exit 4, "expired"), sends nothing,
    and a new approval under the stepped clock sends it once; back, the resume sends it once; either way a
    further resume (on our clock) sends nothing more, and ``verify`` says ok."""
    effects = tmp_path / "effects.txt"
    plan = _shell_plan(tmp_path / "plan.json", effects, approval=True)
    assert 4 == effectlog("run", "--journal", "j.db", str(plan), cwd=tmp_path).returncode
    assert 0 == effectlog(*APPROVE, "--expires-in", "600", cwd=tmp_path).returncode
    resumed = _effectlog_at(step, "run", "--journal", "j.db", str(plan), cwd=tmp_path)
    sent = effects.read_text().split() if effects.exists() else []
    if step == "forward":
        assert (4, []) == (resumed.returncode, sent), resumed.stderr
        assert "expired" in resumed.stderr
        assert 0 == _effectlog_at(step, *APPROVE, cwd=tmp_path).returncode  # held again: the same attempt
        resumed = _effectlog_at(step, "run", "--journal", "j.db", str(plan), cwd=tmp_path)
    assert (0, ["s1"]) == (resumed.returncode, effects.read_text().split()), resumed.stderr
    again = effectlog("run", "--journal", "j.db", str(plan), cwd=tmp_path)
    assert (0, ["s1"]) == (again.returncode, effects.read_text().split()), again.stderr
    assert 0 == effectlog("verify", "--journal", "j.db", cwd=tmp_path).returncode


def test_a_clock_stepped_forward_past_a_runners_lease_sends_nothing_again_without_a_person(tmp_path: Path) -> None:
    """A fleet runner on a SQLite store is inside a non-idempotent step's call when the wall clock steps an
    hour forward: the store's clock is the wall clock, so the lease reads as expired although its runner is
    alive. (A known limit, not fixed here: the recovery pass then hands the step to a person while the call
    still runs.) Proves the part that must hold whatever the clock does: the recovery pass and another
    runner after the step send nothing again (the step is uncertain, the request needs an operator), the
    live runner's late writes are fenced (nothing after ``run.stopped``), the effect is made once, and
    ``verify`` says ok."""
    effects, go = tmp_path / "effects.txt", tmp_path / "go"
    plan = _shell_plan(tmp_path / "plan.json", effects, wait_for=go)
    assert (
        0
        == effectlog("submit", "--store", "store.db", "--scope", "s", "--key", "k", str(plan), cwd=tmp_path).returncode
    )
    fast = ("--exit-when-idle", "--lease-s", "30", "--heartbeat-s", "0.2", "--poll-s", "0.05")
    runner = subprocess.Popen(
        [sys.executable, "-m", "effectlog", "runner", "--store", "store.db", "--runner-id", "A", *fast],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for(effects, runner)
        recovered = _effectlog_at("forward", "recovery", "--store", "store.db", "--once", cwd=tmp_path)
        other = _effectlog_at("forward", "runner", "--store", "store.db", "--runner-id", "B", *fast, cwd=tmp_path)
    finally:
        go.touch()
    runner.communicate(timeout=SAFETY_TIMEOUT_S)
    tags = [type(e).__struct_config__.tag for e in _events(tmp_path / "store.db")]
    assert (0, 0, ["s1"]) == (recovered.returncode, other.returncode, effects.read_text().split()), recovered.stderr
    assert ["step.uncertain", "run.stopped"] == tags[-2:], tags
    assert 0 == effectlog("verify", "--journal", "store.db", cwd=tmp_path).returncode


def test_a_console_deny_racing_a_cli_approve_of_one_step_records_one_decision(tmp_path: Path) -> None:
    """The console's JSON API (olga's token) denies a held refund while ``effectlog approve`` approves it
    from a terminal: the console's decision read the step first and is paused there (the console runs
    under the same steering as the CLI above) until the CLI's approval is written. Proves: one decision is
    journaled, the approval; the console answers 409 ``decision_stale`` naming the approval written
    meanwhile, never a 500 or a second decision; the resumed run sends the refund once."""
    from console_kit import TOKENS, Setup, effects_rows, free_port, held_plan

    setup = Setup(tmp_path)
    run_id = setup.held("refund-race")
    steer = tmp_path / "steer"
    steer.mkdir()
    (tmp_path / "paused.py").write_text(_PAUSED)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(tmp_path / "paused.py"), str(steer), "console", "--journal", setup.journal,
         "--users", setup.users, "--port", str(port)],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    answer: dict[str, Any] = {}
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + SAFETY_TIMEOUT_S
        while True:
            try:
                httpx.get(f"{base}/login", timeout=5)
                break
            except httpx.TransportError:
                assert server.poll() is None, server.communicate()
                assert time.monotonic() < deadline, "the console did not start"
                time.sleep(0.1)
        api = httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {TOKENS['olga']}"}, timeout=SAFETY_TIMEOUT_S
        )

        def deny() -> None:
            done = api.post(f"/api/runs/{run_id}/steps/refund/deny", json={"reason": "fraud", "attempt": "1"})
            answer.update(status=done.status_code, body=done.json())

        denying = threading.Thread(target=deny)
        denying.start()
        _wait_for(steer / "reached", server)
        approved = effectlog(
            "approve", "--journal", setup.journal, "--run-id", run_id, "--step", "refund", "--by", "ann",
            "--attempt", "1", cwd=tmp_path,
        )  # fmt: skip
        (steer / "go").touch()
        denying.join(SAFETY_TIMEOUT_S)
        api.close()
    finally:
        (steer / "go").touch()
        server.terminate()
        server.communicate(timeout=SAFETY_TIMEOUT_S)
    decided = [e["type"] for e in setup.timeline(run_id) if e["type"] == "step.approved" or e.get("decision") == "deny"]
    assert (0, 409, "decision_stale", ["step.approved"]) == (
        approved.returncode, answer.get("status"), answer.get("body", {}).get("code"), decided
    ), (approved.stderr, answer)  # fmt: skip
    assert "step.approved" in answer["body"]["error"]
    setup.run(held_plan(run_id), 0)
    assert 1 == len(effects_rows(setup))


@pytest.mark.parametrize(
    ("scope", "key"),
    [
        pytest.param("s", unicodedata.normalize("NFD", "order-é"), id="decomposed-key"),
        pytest.param("s", "order-é ", id="trailing-space-key"),
        pytest.param(unicodedata.normalize("NFD", "shop-é"), "order-é", id="decomposed-scope"),
    ],
)
def test_a_submit_under_another_spelling_of_a_scope_and_key_there_is_refused(
    tmp_path: Path, scope: str, key: str
) -> None:
    """``effectlog submit`` is idempotent by scope and key: a client retrying a submission gets the request
    it made. A retry from another host whose key (or scope) is the same text in another Unicode spelling,
    or read with a trailing space, and whose plan has a fresh run id, was a second request, so a second run
    whose step was sent again. Proves: the second submit is refused (exit 2, one line naming the key or
    scope as another spelling of the one there, or its edge), and the store holds the first request only."""
    first = _shell_plan(tmp_path / "first.json", tmp_path / "effects.txt")
    second = tmp_path / "second.json"
    second.write_text(first.read_text().replace('"pay"', '"pay-retry"'))
    submit = ["submit", "--store", "store.db", "--scope"]
    made = effectlog(*submit, unicodedata.normalize("NFC", "shop-é") if scope != "s" else "s", "--key",
                     "order-é", str(first), cwd=tmp_path)  # fmt: skip
    assert 0 == made.returncode, made.stderr
    again = effectlog(*submit, scope, "--key", key, str(second), cwd=tmp_path)
    listed = effectlog("requests", "--store", "store.db", "--json", cwd=tmp_path)
    assert (2, 1) == (again.returncode, len(json.loads(listed.stdout))), (again.stderr, listed.stdout)
    line = one_line(again.stderr)
    assert ascii(scope if scope != "s" else key) in line, line


def test_a_submit_under_another_spelling_of_a_key_is_refused_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    """The same refusal on a PostgreSQL fleet store (the same ``submit``, its other dialect). Proves: the
    decomposed key is refused (exit 2) and the store holds one request; the composed one resubmitted
    with its own plan is the same request (exit 0, not created again)."""
    first = _shell_plan(tmp_path / "first.json", tmp_path / "effects.txt")
    second = tmp_path / "second.json"
    second.write_text(first.read_text().replace('"pay"', '"pay-retry"'))
    submit = ["submit", "--store", pg_url, "--scope", "s", "--key"]
    assert 0 == effectlog(*submit, "order-é", str(first), cwd=tmp_path).returncode
    again = effectlog(*submit, unicodedata.normalize("NFD", "order-é"), str(second), cwd=tmp_path)
    same = effectlog(*submit, "order-é", str(first), cwd=tmp_path)
    listed = effectlog("requests", "--store", pg_url, "--json", cwd=tmp_path)
    assert (2, 0, 1) == (again.returncode, same.returncode, len(json.loads(listed.stdout))), again.stderr


def test_approve_and_deny_at_once_on_postgresql_record_one_decision(tmp_path: Path, pg_url: str) -> None:
    """The approve-against-deny race on a PostgreSQL journal (operators on two hosts): the deny read the
    step first and is paused until the approval is written. Proves: one decision, the approval; the deny
    exits 5 ``decision_stale`` naming it; the resumed run sends the step once."""
    effects = tmp_path / "effects.txt"
    plan = _shell_plan(tmp_path / "plan.json", effects, approval=True)
    assert 4 == effectlog("run", "--journal", pg_url, str(plan), cwd=tmp_path).returncode
    lost, won = _race(tmp_path, [a.replace("j.db", pg_url) for a in DENY], [a.replace("j.db", pg_url) for a in APPROVE])
    resumed = effectlog("run", "--journal", pg_url, str(plan), cwd=tmp_path)
    timeline = effectlog("timeline", "--journal", pg_url, "--run-id", "pay", "--json", cwd=tmp_path)
    decided = [
        e["type"] for e in json.loads(timeline.stdout) if e["type"] == "step.approved" or e.get("decision") == "deny"
    ]
    line = one_line(lost.stderr)
    assert (0, 5, ["step.approved"], 0, ["s1"]) == (
        won.returncode, lost.returncode, decided, resumed.returncode, effects.read_text().split()
    ), line  # fmt: skip
    assert (True, True) == ("decision_stale" in line, "step.approved" in line), line


@pytest.mark.parametrize("command", ["approve", "deny"])
def test_a_decision_naming_a_held_step_in_another_spelling_names_the_recorded_step(
    tmp_path: Path, command: str
) -> None:
    """A session's keyed step ``remboursé`` (composed) is held for approval; the operator types the key
    with a decomposed accent. ``approve``/``deny`` said "cannot approve: the step has not started", of a
    step every listing shows as held. Proves: exit 2, nothing written, one line naming the held step with
    its code points (``ascii``) as another spelling of the one given."""
    from effectlog.errors import ApprovalRequired
    from effectlog.session import ScriptedModel, Session, SqliteCheckpointer
    from session_kit import toolbox

    journal = tmp_path / "runs.db"
    key = unicodedata.normalize("NFC", "remboursé")
    store = SqliteCheckpointer(journal)
    session = Session("r-1", ScriptedModel([], tools=toolbox(tmp_path / "calls.log", idempotent=False)), store,
                      policy=lambda call: "require_approval")  # fmt: skip
    with pytest.raises(ApprovalRequired):
        asyncio.run(session.tool("transfer", {"to": "bob", "amount": 5}, key=key))
    session.release()
    store.close()
    before = journal.read_bytes()
    extra = ["--reason", "no"] if command == "deny" else []
    refused = effectlog(command, "--journal", str(journal), "--run-id", "r-1", "--step",
                        unicodedata.normalize("NFD", key), "--by", "ann", *extra, cwd=tmp_path)  # fmt: skip
    line = one_line(refused.stderr)
    assert (2, True, True) == (refused.returncode, ascii(key) in line, journal.read_bytes() == before), line
