"""The life of a run after things go wrong (issue 17): recover at start-up, fork and retry, repin.

Real processes throughout: runs are ``effectlog run`` processes killed with SIGKILL or
stopped with SIGTERM, recoveries are ``effectlog recover`` processes started together,
and every effect is counted in the effect store (``effects.control`` writes a row on
every call, so an effect done twice shows as two rows).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import journal_tamper
from effectlog import events as ev
from effectlog.errors import ExitStatus, ForkRefused, SecretUnavailable
from effectlog.journal import load_run, open_journal
from effectlog.outcome import SimulatedCrash
from effectlog.plan import parse_plan
from effectlog.runtime import Runtime

pytest_plugins = ["pg_fixture"]

TESTS = Path(__file__).resolve().parent
SAFETY_S = 90.0
ADAPTERS = "lifecycle_adapters:ADAPTERS"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "EFFECTLOG_JOURNAL_KEY"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH", "")) if p)
    return env


def effectlog(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectlog", *args],
        capture_output=True, text=True, timeout=SAFETY_S, check=False, cwd=cwd, env=_env(),
    )  # fmt: skip


def start(*args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "effectlog", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=_env(),
    )  # fmt: skip


def wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + SAFETY_S
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"the run exited {proc.returncode} before {path.name}: {proc.communicate()}")
        if time.monotonic() > deadline:
            pytest.fail(f"the run never reached {path.name}")
        time.sleep(0.02)


def effect_counts(effects: Path) -> Counter[tuple[str, str]]:
    """How many times each (run, step) effect was made, from the effect store itself."""
    db = sqlite3.connect(f"{effects.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return Counter((r, s) for r, s in db.execute("SELECT run_id, step_id FROM effects"))
    finally:
        db.close()


def tags(journal: Path, run_id: str) -> list[str]:
    j = open_journal(str(journal), writer=False)
    try:
        return [ev.tag_of(ev.decode(r.body)) for r in j.read(run_id)]
    finally:
        j.close()


def state_of(journal: Path, run_id: str) -> Any:
    j = open_journal(str(journal), writer=False)
    try:
        return load_run(j, run_id)
    finally:
        j.close()


def write_plan(tmp: Path, plan: dict[str, Any]) -> Path:
    path = tmp / f"{plan['run_id']}.json"
    path.write_text(json.dumps(plan))
    return path


LEDGER = {"type": "effects.control", "version": "1", "idempotent": False}


# -- 1. recovery at start-up ----------------------------------------------------------


def slow_plan(tmp: Path, run_id: str) -> Path:
    """before (an effect), wait (idempotent, holds while `hold` exists), after (an effect)."""
    slow = {"hold": str(tmp / "hold"), "started": str(tmp / "started")}
    return write_plan(
        tmp,
        {
            "run_id": run_id,
            "adapters": {"ledger": LEDGER, "slow": {"type": "test.slow", "idempotent": True, "options": slow}},
            "steps": [
                {"id": "before", "adapter": "ledger", "args": {"n": 1}},
                {"id": "wait", "adapter": "slow"},
                {"id": "after", "adapter": "ledger", "args": {"n": 2}},
            ],
        },
    )


def test_two_recoveries_at_once_finish_every_killed_run_and_each_effect_happens_once(tmp_path: Path) -> None:
    """Four runs killed (SIGKILL) mid-way; two `effectlog recover` at once: every run completes, driven once.

    Each run is resumed by exactly one of the two recoveries (the other reports it skipped, or
    found it closed), a third one started meanwhile reports every run skipped, naming its
    owner, each run's journal holds exactly one run.resumed, and the effect store holds exactly
    one effect per step: none repeated, none lost. No plan file is read (they are deleted first).
    """
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    run_ids = [f"r{i}" for i in range(4)]
    (tmp_path / "hold").touch()
    procs = {}
    for rid in run_ids:
        plan = slow_plan(tmp_path, rid)
        procs[rid] = start(
            "run", str(plan), "--journal", str(journal), "--effects", str(effects), "--adapters", ADAPTERS
        )
    for rid, proc in procs.items():
        wait_for(tmp_path / f"started-{rid}", proc)
    for proc in procs.values():
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=SAFETY_S)
    for rid in run_ids:
        (tmp_path / f"{rid}.json").unlink()  # recovery needs the journal only
        (tmp_path / f"started-{rid}").unlink()
        assert ("running", "requested") == (state_of(journal, rid).state, state_of(journal, rid).steps["wait"].state)

    # Two start together and contend for the same four runs; `wait` holds each run where it
    # is driven until all four are. A third, started then, finds every run driven by another.
    args = ("recover", "--journal", str(journal), "--effects", str(effects), "--adapters", ADAPTERS, "--json")
    recoveries = [start(*args), start(*args)]
    for rid in run_ids:
        wait_for(tmp_path / f"started-{rid}", recoveries[0] if recoveries[0].poll() is None else recoveries[1])
    late = effectlog(*args)
    assert 0 == late.returncode, late.stderr
    assert {rid: "skipped" for rid in run_ids} == {r["run_id"]: r["action"] for r in json.loads(late.stdout)}
    assert all("driven by run pid" in r["message"] for r in json.loads(late.stdout))
    (tmp_path / "hold").unlink()
    outputs = [p.communicate(timeout=SAFETY_S) for p in recoveries]
    assert [0, 0] == [p.returncode for p in recoveries], outputs
    reports = [r for out, _ in outputs for r in json.loads(out)]

    assert {rid: 1 for rid in run_ids} == Counter(r["run_id"] for r in reports if r["action"] == "resumed")
    assert [] == [r for r in reports if r["action"] == "refused"]
    assert {rid: "completed" for rid in run_ids} == {rid: state_of(journal, rid).state for rid in run_ids}
    assert {rid: 1 for rid in run_ids} == {rid: tags(journal, rid).count("run.resumed") for rid in run_ids}
    expected = Counter({(rid, step): 1 for rid in run_ids for step in ("before", "after")})
    assert expected == effect_counts(effects)


def test_recover_reports_runs_that_wait_for_a_person_and_lists_sessions_without_driving_them(tmp_path: Path) -> None:
    """A suspended run and a session run are reported as skipped, with what they wait for; nothing is written.

    ``Runtime.pending("session")`` lists the session run, so its application can re-drive it.
    """
    journal = tmp_path / "j.db"
    plan = write_plan(
        tmp_path,
        {
            "run_id": "held",
            "adapters": {"n": {"type": "noop"}},
            "steps": [{"id": "pay", "adapter": "n", "approval": "required"}],
        },
    )
    assert ExitStatus.SUSPENDED == effectlog("run", str(plan), "--journal", str(journal)).returncode
    with Runtime(str(journal)) as rt:
        rt.journal.append([ev.RunStarted(run_id="chat-1", seq=1, ts=1, kind="session")])
        assert ["chat-1"] == [p.run_id for p in rt.pending("session")]
        assert [("held", "approval", "pay")] == [(p.run_id, p.waits, p.blocked_step) for p in rt.pending("plan")]
    before = {r: tags(journal, r) for r in ("held", "chat-1")}
    done = effectlog("recover", "--journal", str(journal), "--json")
    assert 0 == done.returncode, done.stderr
    report = {r["run_id"]: (r["action"], r["state"]) for r in json.loads(done.stdout)}
    assert {"held": ("skipped", "suspended"), "chat-1": ("skipped", "running")} == report
    assert before == {r: tags(journal, r) for r in ("held", "chat-1")}


def crash_after(step_id: str) -> Any:
    def hook(point: str, sid: str) -> None:
        if point == "after_confirm" and sid == step_id:
            raise SimulatedCrash(point)

    return hook


SECRET_PLAN = {
    "run_id": "pay-1",
    "adapters": {"ledger": LEDGER},
    "steps": [
        {"id": "a", "adapter": "ledger", "args": {"n": 1}},
        {"id": "b", "adapter": "ledger", "args": {"card": "4111-1111", "n": 2}, "secret": ["card"]},
    ],
}


def test_a_run_with_secret_args_is_recovered_only_with_the_value_supplied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal keeps secret args as digests: recover refuses the run by name until the value is supplied.

    Without EFFECTLOG_SECRET_CARD the run is reported refused (secret_unavailable, exit 2) and
    nothing is written; with it, the run completes and step b's effect happens once.
    """
    journal, effects = str(tmp_path / "j.db"), tmp_path / "e.db"
    plan = parse_plan(json.dumps(SECRET_PLAN).encode())
    with Runtime(journal, effects=effects, crash_hook=crash_after("a")) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    monkeypatch.delenv("EFFECTLOG_SECRET_CARD", raising=False)
    with Runtime(journal, effects=effects) as rt:
        [refused] = rt.recover()
        assert ("refused", int(SecretUnavailable.exit_status)) == (refused.action, refused.exit_status)
        assert "EFFECTLOG_SECRET_CARD" in refused.message
        monkeypatch.setenv("EFFECTLOG_SECRET_CARD", "4111-1111")
        [resumed] = rt.recover()
        assert ("resumed", "completed") == (resumed.action, resumed.state)
    assert Counter({("pay-1", "a"): 1, ("pay-1", "b"): 1}) == effect_counts(effects)


# -- 2. fork and retry ---------------------------------------------------------------


def gate_plan(tmp: Path, run_id: str = "order-1") -> Path:
    """charge (an effect), ship (not applied until the file `open` exists), email (an effect)."""
    return write_plan(
        tmp,
        {
            "run_id": run_id,
            "adapters": {"ledger": LEDGER, "gate": {"type": "test.gate", "options": {"open": str(tmp / "open")}}},
            "steps": [
                {"id": "charge", "adapter": "ledger", "args": {"cents": 500}},
                {"id": "ship", "adapter": "gate"},
                {"id": "email", "adapter": "ledger", "args": {"to": "a@example.com"}},
            ],
        },
    )


def test_retry_of_a_failed_run_carries_its_earlier_results_and_repeats_no_effect(tmp_path: Path) -> None:
    """A run failed at `ship`; `effectlog retry` forks it from there: `charge` is carried, not charged again.

    The parent stays failed and unchanged; the fork's first events name the parent
    (run.started.forked_from, step.carried.from_run/from_seq, the parent's key and receipt);
    `lineage` shows the fork from both sides; the effect store has one charge and one email.
    A second retry of the same run is refused (exit 5): its fork already carries on.
    """
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    common = ("--journal", str(journal), "--effects", str(effects), "--adapters", ADAPTERS)
    assert ExitStatus.RUN_FAILED == effectlog("run", str(gate_plan(tmp_path)), *common).returncode
    parent_before = tags(journal, "order-1")
    (tmp_path / "open").touch()

    done = effectlog("retry", "--run-id", "order-1", "--by", "ops", "--reason", "carrier back up", *common)
    assert 0 == done.returncode, done.stderr

    assert parent_before == tags(journal, "order-1")
    assert "failed" == state_of(journal, "order-1").state
    child = state_of(journal, "order-1.retry1")
    parent = state_of(journal, "order-1")
    assert ("completed", ["confirmed"] * 3) == (child.state, [s.state for s in child.ordered_steps()])
    j = open_journal(str(journal), writer=False)
    try:
        first = [ev.decode(r.body) for r in j.read("order-1.retry1")][:2]
    finally:
        j.close()
    started, carried = first
    assert isinstance(started, ev.RunStarted)
    assert isinstance(carried, ev.StepCarried)
    assert ("order-1", "ship", "ops", "carrier back up") == (
        started.forked_from,
        started.from_step,
        started.by,
        started.reason,
    )
    charge = parent.steps["charge"]
    assert ("order-1", charge.last_seq, charge.idempotency_key, charge.receipt) == (
        carried.from_run,
        carried.from_seq,
        carried.idempotency_key,
        carried.receipt,
    )
    assert child.steps["ship"].idempotency_key != parent.steps["ship"].idempotency_key  # new keys for the rest
    expected = Counter({("order-1", "charge"): 1, ("order-1.retry1", "email"): 1})
    assert expected == effect_counts(effects)

    again = effectlog("retry", "--run-id", "order-1", "--by", "ops", "--reason", "once more", *common)
    assert (ExitStatus.CONFLICT, True) == (again.returncode, "already forked as order-1.retry1" in again.stderr)
    assert expected == effect_counts(effects)

    lineage = json.loads(effectlog("lineage", "--journal", str(journal), "--run-id", "order-1", "--json").stdout)
    assert ["order-1.retry1"] == [f["run_id"] for f in lineage["forks"]]
    up = json.loads(effectlog("lineage", "--journal", str(journal), "--run-id", "order-1.retry1", "--json").stdout)
    assert ("order-1", "ship") == (up["forked_from"], up["from_step"])


def test_fork_from_an_earlier_step_runs_that_step_again_under_a_new_key(tmp_path: Path) -> None:
    """`fork --from-step charge` carries nothing and charges again, on purpose, under the fork's own key."""
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    common = ("--journal", str(journal), "--effects", str(effects), "--adapters", ADAPTERS)
    (tmp_path / "open").touch()
    assert 0 == effectlog("run", str(gate_plan(tmp_path)), *common).returncode
    done = effectlog(
        "fork", "--run-id", "order-1", "--new-run-id", "order-2", "--from-step", "charge",
        "--by", "ops", "--reason", "customer ordered again", *common,
    )  # fmt: skip
    assert 0 == done.returncode, done.stderr
    assert "step.carried" not in tags(journal, "order-2")
    keys = {state_of(journal, r).steps["charge"].idempotency_key for r in ("order-1", "order-2")}
    assert 2 == len(keys)
    assert 2 == effect_counts(effects)[("order-1", "charge")] + effect_counts(effects)[("order-2", "charge")]


def test_a_fork_is_refused_from_an_open_run_and_resends_an_unknown_outcome_under_the_parents_key(
    tmp_path: Path,
) -> None:
    """Exit 5, naming why, for an open run; an idempotent step of unknown outcome is sent again, same key.

    The endpoint still does not answer, so the retry fails again (exit 1) with the same
    key sent, and the parent is unchanged (tests/test_fork_stores_and_keys.py proves the
    effect happens once when the answers come back). Also: a completed run has nothing to
    retry, a new run id that exists is refused, and the Python API raises ForkRefused for
    the same cases. The journal is unchanged by every refusal.
    """
    journal = tmp_path / "j.db"
    common = ("--journal", str(journal), "--adapters", ADAPTERS)
    unsure = write_plan(
        tmp_path,
        {
            "run_id": "call-1",
            "adapters": {"api": {"type": "test.unsure", "idempotent": True}},
            "steps": [{"id": "call", "adapter": "api"}],
        },
    )
    assert ExitStatus.RUN_FAILED == effectlog("run", str(unsure), *common).returncode
    before = tags(journal, "call-1")
    done = effectlog("retry", "--run-id", "call-1", "--by", "ops", "--reason", "try again", *common)
    assert ExitStatus.RUN_FAILED == done.returncode, done.stderr
    assert before == tags(journal, "call-1")
    parent, child = state_of(journal, "call-1"), state_of(journal, "call-1.retry1")
    assert parent.steps["call"].idempotency_key == child.steps["call"].idempotency_key
    assert ("failed", None) == (child.steps["call"].state, child.steps["call"].applied)
    with Runtime(str(journal)) as rt:
        assert ["call-1.retry1"] == [f.run_id for f in rt.forks("call-1")]

    held = write_plan(
        tmp_path,
        {
            "run_id": "held",
            "adapters": {"n": {"type": "noop"}},
            "steps": [{"id": "s", "adapter": "n", "approval": "required"}],
        },
    )
    assert ExitStatus.SUSPENDED == effectlog("run", str(held), *common).returncode
    done = effectlog("fork", "--run-id", "held", "--new-run-id", "held-2", "--by", "o", "--reason", "r", *common)
    assert (ExitStatus.CONFLICT, True) == (done.returncode, "still open" in done.stderr)

    ok = write_plan(
        tmp_path, {"run_id": "ok", "adapters": {"n": {"type": "noop"}}, "steps": [{"id": "s", "adapter": "n"}]}
    )
    assert 0 == effectlog("run", str(ok), *common).returncode
    done = effectlog("retry", "--run-id", "ok", "--by", "o", "--reason", "r", *common)
    assert (ExitStatus.CONFLICT, True) == (done.returncode, "every step of the run is done" in done.stderr)
    with Runtime(str(journal)) as rt, pytest.raises(ForkRefused, match="already exists"):
        rt.fork("ok", "held", by="o", reason="r", from_step="s")


# -- 3. repin after an upgrade -------------------------------------------------------

TOOLS = """
import time
from pathlib import Path


class Hold:
    def __init__(self, options):
        self.options = options

    def invoke(self, request):
        Path(self.options["started"]).touch()
        while Path(self.options["hold"]).exists():
            time.sleep(0.02)
        return {"done": request.step_id}


ADAPTERS = {"my.hold": lambda decl, ctx: Hold(decl.options)}
"""


def hold_plan(tmp: Path, run_id: str, idempotent: bool) -> Path:
    options = {"hold": str(tmp / "hold"), "started": str(tmp / f"started-{run_id}")}
    return write_plan(
        tmp,
        {
            "run_id": run_id,
            "adapters": {"tool": {"type": "my.hold", "idempotent": idempotent, "options": options}, "ledger": LEDGER},
            "steps": [{"id": "work", "adapter": "tool"}, {"id": "record", "adapter": "ledger", "args": {"n": 1}}],
        },
    )


def test_an_upgraded_adapter_is_refused_until_repinned_then_the_run_completes(tmp_path: Path) -> None:
    """Stop a run between steps (SIGTERM), edit its adapter's module: resume refused (exit 5) naming `repin`.

    While the run is driven, repin is refused (exit 6, run_owned): the ownership rule.
    `recover` reports the run refused too (exit 5), with the same way forward.

    `effectlog repin` records run.repinned (who, why, old and new fingerprints); the
    resume then completes, and `record`'s effect happens once.
    """
    (tmp_path / "my_tools.py").write_text(TOOLS)
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    plan = hold_plan(tmp_path, "up-1", idempotent=True)
    common = ("--journal", str(journal), "--effects", str(effects), "--adapters", "my_tools:ADAPTERS")
    (tmp_path / "hold").touch()
    proc = start("run", str(plan), *common, cwd=tmp_path)
    wait_for(tmp_path / "started-up-1", proc)
    owned = effectlog("repin", "--run-id", "up-1", "--by", "ops", "--reason", "too early", *common, cwd=tmp_path)
    assert (ExitStatus.LOCKED, True) == (owned.returncode, "run_owned" in owned.stderr), owned.stderr
    proc.send_signal(signal.SIGTERM)  # stop after the current step's commit
    (tmp_path / "hold").unlink()
    proc.communicate(timeout=SAFETY_S)
    assert 128 + signal.SIGTERM == proc.returncode
    assert ("running", "confirmed") == (state_of(journal, "up-1").state, state_of(journal, "up-1").steps["work"].state)

    (tmp_path / "my_tools.py").write_text(TOOLS + "\n# v2: a comment is a new implementation\n")
    recovered = effectlog("recover", *common, "--json", cwd=tmp_path)
    [report] = json.loads(recovered.stdout)
    assert (ExitStatus.CONFLICT, "refused", True) == (
        recovered.returncode,
        report["action"],
        "effectlog repin --journal" in report["message"],
    )
    refused = effectlog("run", str(plan), *common, cwd=tmp_path)
    assert ExitStatus.CONFLICT == refused.returncode
    assert [] == [w for w in ("plan_mismatch", "effectlog repin --journal") if w not in refused.stderr], refused.stderr
    assert 1 == len(refused.stderr.strip().splitlines())

    done = effectlog(
        "repin", "--run-id", "up-1", "--by", "ops", "--reason", "v2 deployed", "--json", *common, cwd=tmp_path
    )
    assert 0 == done.returncode, done.stderr
    assert ["tool"] == list(json.loads(done.stdout)["changed"])
    again = effectlog("repin", "--run-id", "up-1", "--by", "ops", "--reason", "v2 deployed", *common, cwd=tmp_path)
    assert (0, True) == (again.returncode, "nothing to repin" in again.stdout)
    assert 1 == tags(journal, "up-1").count("run.repinned")

    resumed = effectlog("run", str(plan), *common, cwd=tmp_path)
    assert 0 == resumed.returncode, resumed.stderr
    assert Counter({("up-1", "record"): 1}) == effect_counts(effects)


def test_repin_is_refused_while_a_step_is_requested_or_uncertain_and_for_another_plan(tmp_path: Path) -> None:
    """Killed in a non-idempotent step: repin refused (exit 5) while requested, and again once uncertain.

    A plan file that differs from the pinned one (another argument) is refused too: only
    implementations may change. Nothing is written by any refusal.
    """
    (tmp_path / "my_tools.py").write_text(TOOLS)
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    plan = hold_plan(tmp_path, "up-2", idempotent=False)
    common = ("--journal", str(journal), "--effects", str(effects), "--adapters", "my_tools:ADAPTERS")
    repin = ("repin", "--run-id", "up-2", "--by", "ops", "--reason", "v2", *common)
    (tmp_path / "hold").touch()
    proc = start("run", str(plan), *common, cwd=tmp_path)
    wait_for(tmp_path / "started-up-2", proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=SAFETY_S)
    (tmp_path / "hold").unlink()
    (tmp_path / "my_tools.py").write_text(TOOLS + "\n# v2\n")

    before = tags(journal, "up-2")
    done = effectlog(*repin, cwd=tmp_path)
    assert (ExitStatus.CONFLICT, True) == (done.returncode, "'work' is requested" in done.stderr), done.stderr
    assert before == tags(journal, "up-2")

    (tmp_path / "my_tools.py").write_text(TOOLS)  # the old implementation finds the step uncertain and stops
    assert ExitStatus.STOPPED_UNCERTAIN == effectlog("run", str(plan), *common, cwd=tmp_path).returncode
    (tmp_path / "my_tools.py").write_text(TOOLS + "\n# v2\n")
    before = tags(journal, "up-2")
    done = effectlog(*repin, cwd=tmp_path)
    assert (ExitStatus.CONFLICT, True) == (done.returncode, "'work' is uncertain" in done.stderr), done.stderr

    other = json.loads(plan.read_text())
    other["steps"][1]["args"] = {"n": 2}
    (tmp_path / "other.json").write_text(json.dumps(other))
    done = effectlog(*repin, "--plan", str(tmp_path / "other.json"), cwd=tmp_path)
    assert (ExitStatus.CONFLICT, True) == (done.returncode, "only implementations may change" in done.stderr), (
        done.stderr
    )
    assert before == tags(journal, "up-2")


# -- the spec format: internal transitions ----------------------------------------------

INTERNAL = """
name = "m"
initial = "a"
terminal = ["z"]
states = ["a", "z"]

[[transitions]]
trigger = "note"
source = ["a"]
event = "m.noted"

[[transitions]]
trigger = "end"
source = ["a"]
dest = "z"
event = "m.ended"
"""


def test_an_internal_transition_keeps_the_state_in_the_table_the_machine_and_the_diagram() -> None:
    """A transition with no `dest` keeps its state: in the compiled table, the transitions machine and the diagram."""
    from effectlog.diagrams import mermaid
    from effectlog.machines import SpecModel
    from effectlog.spec import Compiled, parse_spec

    spec = parse_spec(INTERNAL, "m.toml")
    model = SpecModel(spec)
    assert ("a", "a", [("m.noted", {})]) == (
        Compiled(spec).next_state("a", "m.noted"),
        model.fire("note"),
        model.emitted,
    )
    assert "    a --> a: note / m.noted" in mermaid(spec).splitlines()
    assert "a" == SpecModel(spec, "a").fire("note", reason="x")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (INTERNAL.replace('source = ["a"]\nevent = "m.noted"', 'source = ["z"]\nevent = "m.noted"'), "leaves terminal"),
        (INTERNAL.replace('event = "m.noted"', 'event = "m.noted"\nby = "how"'), "`by` needs a dest table"),
    ],
    ids=["from a terminal state", "by without dest"],
)
def test_an_internal_transition_is_refused_from_a_terminal_state_or_with_by(text: str, reason: str) -> None:
    """A closed state admits no transition, not even one that keeps it; `by` needs a dest table."""
    from effectlog.errors import SpecError
    from effectlog.spec import parse_spec

    with pytest.raises(SpecError, match=reason):
        parse_spec(text, "m.toml")


# -- PostgreSQL ------------------------------------------------------------------------


def test_postgres_recover_then_retry_repeat_no_effect(tmp_path: Path, pg_url: str) -> None:
    """On PostgreSQL: a crashed run is recovered from its pinned plan; a failed one is retried; each effect once."""
    effects = tmp_path / "e.db"
    steps = [{"id": "a", "adapter": "ledger", "args": {"n": 1}}, {"id": "b", "adapter": "ledger", "args": {"n": 2}}]
    crashed = parse_plan(json.dumps({"run_id": "pg-1", "adapters": {"ledger": LEDGER}, "steps": steps}).encode())
    with Runtime(pg_url, effects=effects, crash_hook=crash_after("a")) as rt, pytest.raises(SimulatedCrash):
        rt.run(crashed)
    gate = json.loads(gate_plan(tmp_path, "pg-2").read_text())
    from effectlog.adapters.registry import load_object

    adapters = load_object(ADAPTERS)
    with Runtime(pg_url, effects=effects, adapters=adapters) as rt:
        assert 1 == rt.run(parse_plan(json.dumps(gate).encode())).exit_status
        [report] = rt.recover()
        assert ("pg-1", "resumed", "completed") == (report.run_id, report.action, report.state)
        (tmp_path / "open").touch()
        outcome = rt.retry("pg-2", by="ops", reason="gate open")
        assert ("pg-2.retry1", "completed") == (outcome.run_id, outcome.state)
        assert ["pg-2.retry1"] == [f.run_id for f in rt.forks("pg-2")]
    expected = {("pg-1", "a"): 1, ("pg-1", "b"): 1, ("pg-2", "charge"): 1, ("pg-2.retry1", "email"): 1}
    assert Counter(expected) == effect_counts(effects)


@pytest.mark.parametrize(
    "argv",
    [
        ("recover",),
        ("retry", "--run-id", "r", "--by", "o", "--reason", "x"),
        ("fork", "--run-id", "r", "--new-run-id", "r2", "--by", "o", "--reason", "x"),
        ("repin", "--run-id", "r", "--by", "o", "--reason", "x"),
    ],
    ids=lambda argv: argv[0],
)
def test_a_missing_journal_is_bad_input_and_is_not_created(tmp_path: Path, argv: tuple[str, ...]) -> None:
    """recover, retry, fork and repin on a journal that does not exist: one line, exit 2, no file made."""
    done = effectlog(*argv, "--journal", str(tmp_path / "nope.db"))
    assert (ExitStatus.BAD_INPUT, 1, []) == (done.returncode, len(done.stderr.splitlines()), list(tmp_path.iterdir()))


def test_a_fork_is_refused_from_or_past_an_uncertain_step_of_a_closed_run(tmp_path: Path) -> None:
    """A run stopped on an uncertain step, then cancelled: no fork may run that step again (exit 5 in the API).

    From the uncertain step itself or an earlier one: refused, naming it (reconcile it first).
    From a later one: refused, the uncertain step is before the fork point and is not done.
    Nothing is written.
    """
    from effectlog.recorder import record_now

    journal, effects = str(tmp_path / "j.db"), tmp_path / "e.db"
    steps = [{"id": s, "adapter": "ledger", "args": {"s": s}} for s in ("a", "b", "c")]
    plan = parse_plan(json.dumps({"run_id": "u-1", "adapters": {"ledger": LEDGER}, "steps": steps}).encode())

    def crash_b(point: str, sid: str) -> None:
        if (point, sid) == ("after_request", "b"):
            raise SimulatedCrash(point)

    with Runtime(journal, effects=effects, crash_hook=crash_b) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    with Runtime(journal, effects=effects) as rt:
        assert "stopped" == rt.run(plan).state
        record_now(rt.journal, rt.load("u-1"), [(ev.RunCancelled, {"by": "ops", "reason": "given up"})], rt.clock)
        before = rt.load("u-1")
        for start, words in (("a", "'b' is uncertain"), ("b", "'b' is uncertain"), ("c", "before the fork point")):
            with pytest.raises(ForkRefused, match=words) as info:
                rt.fork("u-1", f"u-{start}", by="ops", reason="again", from_step=start)
            assert ExitStatus.CONFLICT == info.value.exit_status
        assert (before, ["u-1"]) == (rt.load("u-1"), rt.journal.runs())


def test_a_run_whose_history_is_damaged_is_refused_and_the_others_are_still_recovered(tmp_path: Path) -> None:
    """Two interrupted runs, one with a stored hash damaged: recover resumes the other and exits 7 naming the first."""
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    steps = [{"id": "a", "adapter": "ledger", "args": {"n": 1}}, {"id": "b", "adapter": "ledger", "args": {"n": 2}}]
    for rid in ("good", "bad"):
        plan = parse_plan(json.dumps({"run_id": rid, "adapters": {"ledger": LEDGER}, "steps": steps}).encode())
        with Runtime(str(journal), effects=effects, crash_hook=crash_after("a")) as rt, pytest.raises(SimulatedCrash):
            rt.run(plan)
    db = journal_tamper.connect(journal, isolation_level=None)
    try:
        db.execute("DROP TRIGGER events_append_only_update")
        db.execute("UPDATE ev SET hash = zeroblob(32) WHERE run_id = 'bad' AND seq = 2")
    finally:
        db.close()
    done = effectlog("recover", "--journal", str(journal), "--effects", str(effects), "--json")
    assert ExitStatus.INTEGRITY == done.returncode, done.stderr
    report = {r["run_id"]: (r["action"], r["state"]) for r in json.loads(done.stdout)}
    assert {"good": ("resumed", "completed"), "bad": ("refused", "unknown")} == report
    assert Counter({("good", "a"): 1, ("good", "b"): 1, ("bad", "a"): 1}) == effect_counts(effects)


def test_a_run_with_secret_args_is_recovered_from_the_whole_plan_given_and_not_from_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`recover(plans=...)`: the whole plan (secret values included) drives the run when it is the pinned one.

    A plan with another secret value is refused (plan_mismatch, exit 5) and writes nothing.
    """
    monkeypatch.delenv("EFFECTLOG_SECRET_CARD", raising=False)
    journal, effects = str(tmp_path / "j.db"), tmp_path / "e.db"
    plan = parse_plan(json.dumps(SECRET_PLAN).encode())
    other = json.loads(json.dumps(SECRET_PLAN))
    other["steps"][1]["args"]["card"] = "5500-0000"
    with Runtime(journal, effects=effects, crash_hook=crash_after("a")) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    with Runtime(journal, effects=effects) as rt:
        before = rt.load("pay-1")
        [refused] = rt.recover(plans={"pay-1": parse_plan(json.dumps(other).encode())})
        assert ("refused", int(ExitStatus.CONFLICT), before) == (refused.action, refused.exit_status, rt.load("pay-1"))
        [resumed] = rt.recover(plans={"pay-1": plan})
        assert ("resumed", "completed") == (resumed.action, resumed.state)
    assert Counter({("pay-1", "a"): 1, ("pay-1", "b"): 1}) == effect_counts(effects)


def test_a_step_reconciled_as_applied_is_carried_as_reconciled_with_its_evidence_kept_in_the_parent(
    tmp_path: Path,
) -> None:
    """charge crashed (uncertain), was reconciled as applied, ship then failed: the retry carries charge as reconciled.

    The effect store still has charge's one effect; the fork's step.carried says
    from_state=reconciled and points at the parent's step.reconciled event.
    """
    from effectlog.adapters.registry import load_object

    journal, effects = str(tmp_path / "j.db"), tmp_path / "e.db"
    plan = parse_plan(json.dumps(json.loads(gate_plan(tmp_path).read_text())).encode())
    adapters = load_object(ADAPTERS)

    def crash_charge(point: str, sid: str) -> None:
        if (point, sid) == ("after_effect", "charge"):
            raise SimulatedCrash(point)

    crashing = Runtime(journal, effects=effects, adapters=adapters, crash_hook=crash_charge)
    with crashing as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    with Runtime(journal, effects=effects, adapters=adapters) as rt:
        assert "stopped" == rt.run(plan).state
        rt.reconcile("order-1", "charge", outcome="applied", evidence="ledger row 1", operator="ops")
        assert "failed" == rt.run(plan).state  # the gate is closed
        (tmp_path / "open").touch()
        assert "completed" == rt.retry("order-1", by="ops", reason="gate open").state
        parent, child = rt.load("order-1"), rt.load("order-1.retry1")
        carried = [
            e for e in (ev.decode(r.body) for r in rt.journal.read("order-1.retry1")) if isinstance(e, ev.StepCarried)
        ]
    assert [("charge", "reconciled", parent.steps["charge"].last_seq)] == [
        (c.step_id, c.from_state, c.from_seq) for c in carried
    ]
    assert ("reconciled", "applied") == (child.steps["charge"].state, child.steps["charge"].outcome)
    assert Counter({("order-1", "charge"): 1, ("order-1.retry1", "email"): 1}) == effect_counts(effects)
