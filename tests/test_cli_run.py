"""The command line end to end, as real subprocesses (``python -m effectlog ...``).

Exit statuses are the documented ones: 0 done, 1 run failed, 2 bad input, 3 stopped on
an uncertain effect, 4 suspended for approval, 5 conflict (plan or adapter mismatch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from effectlog.adapters import idempotency_key
from effectlog.adapters.registry import BUILTINS
from effectlog.plan import Plan

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# A user's adapters module, loaded with --adapters: tools whose reply gets lost.
TOOLS_MODULE = '''
from effectlog.adapters import Receipt


class LostReply:
    """Applies the effect in the ledger, then the reply is lost: outcome unknown."""

    def __init__(self, store):
        self.store = store

    def invoke(self, request):
        self.store.apply_control(request)
        raise ConnectionError("connection reset after the effect")

    def lookup(self, request):
        return self.store.lookup(request)


class FirstSendLost:
    """The first attempt's request never reaches the ledger; later attempts apply the effect."""

    def __init__(self, store):
        self.store = store

    def invoke(self, request):
        if request.attempt == 1:
            raise ConnectionError("connection reset before the effect")
        return self.store.apply_control(request)

    def lookup(self, request):
        return self.store.lookup(request)


ADAPTERS = {
    "test.lost-reply": lambda decl, ctx: LostReply(ctx.effect_store()),
    "test.first-send-lost": lambda decl, ctx: FirstSendLost(ctx.effect_store()),
}
'''


class Cli:
    """Runs ``python -m effectlog`` in a temporary directory with one journal and one effect store."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.journal = str(tmp_path / "journal.db")
        self.effects = str(tmp_path / "effects.db")
        (tmp_path / "el_user_tools.py").write_text(TOOLS_MODULE)
        # Ours first (it may point at the source under test), then the user's tools module.
        path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(tmp_path)]))
        self.env = {**os.environ, "PYTHONPATH": path}
        self.env.pop("EFFECTLOG_JOURNAL_KEY", None)

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "effectlog", *args],
            cwd=self.dir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def run(self, plan: Path | str, *extra: str) -> subprocess.CompletedProcess[str]:
        return self("run", str(plan), "--journal", self.journal, "--effects", self.effects, *extra)

    def json(self, *args: str) -> Any:
        done = self(*args, "--json")
        assert (0, "") == (done.returncode, done.stderr)
        return json.loads(done.stdout)

    def status(self, run_id: str) -> dict[str, Any]:
        status: dict[str, Any] = self.json("status", "--journal", self.journal, "--run-id", run_id)
        return status

    def timeline(self, run_id: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self.json("timeline", "--journal", self.journal, "--run-id", run_id)
        return events

    def effects_rows(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.json("effects", "--effects", self.effects)
        return rows

    def plan(self, name: str, raw: dict[str, Any]) -> Path:
        path = self.dir / name
        path.write_text(json.dumps(raw))
        return path


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The CLI's error contract: exactly one line on stderr, no traceback."""
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert 1 == len(lines), done.stderr
    return lines[0]


# -- run, status, timeline, effects ----------------------------------------------------------


def test_the_payment_example_runs_and_status_timeline_effects_describe_it(cli: Cli) -> None:
    """examples/payment.json completes (exit 0); ``status --json`` has run_id, state and
    steps [{id, state, attempt}]; ``timeline --json`` lists its events in order; ``effects --json``
    lists one ledger row per step, each naming its run, step and attempt."""
    done = cli.run(EXAMPLES / "payment.json")

    assert 0 == done.returncode, done.stderr
    status = cli.status("payment-001")
    assert {
        "run_id": "payment-001",
        "state": "completed",
        "steps": [
            {"id": "charge", "state": "confirmed", "attempt": 1},
            {"id": "email-receipt", "state": "confirmed", "attempt": 1},
        ],
    } == {k: status[k] for k in ("run_id", "state", "steps")}
    timeline = cli.timeline("payment-001")
    assert list(range(1, len(timeline) + 1)) == [e["seq"] for e in timeline]
    assert [
        ("run.started", None),
        ("step.requested", "charge"),
        ("step.effected", "charge"),
        ("step.confirmed", "charge"),
        ("step.requested", "email-receipt"),
        ("step.effected", "email-receipt"),
        ("step.confirmed", "email-receipt"),
        ("run.completed", None),
    ] == [(e["type"], e.get("step_id")) for e in timeline]
    assert [
        ("payment-001", "charge", 1, "idempotent", idempotency_key("payment-001", "charge", 1)),
        ("payment-001", "email-receipt", 1, "control", idempotency_key("payment-001", "email-receipt", 1)),
    ] == [(r["run_id"], r["step_id"], r["attempt"], r["kind"], r["idempotency_key"]) for r in cli.effects_rows()]


def test_status_without_a_run_id_lists_every_run(cli: Cli) -> None:
    """``status --json`` without ``--run-id`` is a list with one entry per run in the journal."""
    cli.run(EXAMPLES / "payment.json")
    cli.run(EXAMPLES / "approval.json")

    listed = cli.json("status", "--journal", cli.journal)

    assert [("payment-001", "completed"), ("refund-042", "suspended")] == sorted(
        (s["run_id"], s["state"]) for s in listed
    )


def test_a_closed_run_rerun_exits_as_recorded_and_writes_nothing(cli: Cli) -> None:
    """Running a completed plan again exits 0, prints the recorded outcome, appends no event and
    applies no effect."""
    cli.run(EXAMPLES / "payment.json")
    timeline, rows = cli.timeline("payment-001"), cli.effects_rows()

    again = cli.run(EXAMPLES / "payment.json")

    assert 0 == again.returncode
    assert "run payment-001 completed" in again.stdout
    assert timeline == cli.timeline("payment-001")
    assert rows == cli.effects_rows()


def test_run_json_reports_the_outcome(cli: Cli) -> None:
    """``run --json`` prints the outcome: state, exit status, steps and what it cost."""
    done = cli.run(EXAMPLES / "payment.json", "--json")

    outcome = json.loads(done.stdout)
    assert ("completed", 0, 2) == (outcome["state"], outcome["exit_status"], outcome["adapter_calls"])
    assert [("charge", "confirmed", 1), ("email-receipt", "confirmed", 1)] == [
        (s["id"], s["state"], s["attempt"]) for s in outcome["steps"]
    ]


# -- approval and denial ----------------------------------------------------------------------


def test_approve_then_resume_applies_the_held_step_once(cli: Cli) -> None:
    """examples/approval.json suspends (exit 4) naming the approve command; ``approve`` exits 0;
    the resumed run completes (exit 0) with exactly one effect."""
    held = cli.run(EXAMPLES / "approval.json")
    assert 4 == held.returncode
    assert f"effectlog approve|deny --journal {cli.journal} --run-id refund-042 --step refund" in held.stderr
    assert ("suspended", []) == (cli.status("refund-042")["state"], cli.effects_rows())

    approved = cli("approve", "--journal", cli.journal, "--run-id", "refund-042", "--step", "refund", "--by", "ana")
    done = cli.run(EXAMPLES / "approval.json")

    assert (0, 0) == (approved.returncode, done.returncode)
    assert [("refund-042", "refund", 1)] == [(r["run_id"], r["step_id"], r["attempt"]) for r in cli.effects_rows()]
    assert "completed" == cli.status("refund-042")["state"]


def test_deny_fails_the_run_with_no_effect(cli: Cli) -> None:
    """``deny`` of a held step exits 0 and is final: the run is failed, resuming exits 1 with no
    effect, and the step reads "denied" (never uncertain)."""
    cli.run(EXAMPLES / "approval.json")

    denied = cli(
        "deny", "--journal", cli.journal, "--run-id", "refund-042", "--step", "refund", "--by", "bo", "--reason", "no"
    )
    rerun = cli.run(EXAMPLES / "approval.json")

    assert (0, 1) == (denied.returncode, rerun.returncode)
    status = cli.status("refund-042")
    assert ("failed", [{"id": "refund", "state": "denied", "attempt": 1}]) == (status["state"], status["steps"])
    assert [] == cli.effects_rows()


def test_approving_a_step_that_is_not_held_is_bad_input_and_writes_nothing(cli: Cli) -> None:
    """``approve`` of a step that is not waiting for approval exits 2 with one line, and the run's
    timeline is unchanged."""
    cli.run(EXAMPLES / "payment.json")
    before = cli.timeline("payment-001")

    done = cli("approve", "--journal", cli.journal, "--run-id", "payment-001", "--step", "charge", "--by", "ana")

    assert 2 == done.returncode
    assert "cannot approve" in one_line_error(done)
    assert before == cli.timeline("payment-001")


# -- uncertain effects and reconciliation --------------------------------------------------------


def user_plan(cli: Cli, run_id: str, adapter_type: str) -> Path:
    return cli.plan(
        f"{run_id}.json",
        {
            "run_id": run_id,
            "adapters": {"psp": {"type": adapter_type, "version": "1", "idempotent": False}},
            "steps": [{"id": "pay", "adapter": "psp", "args": {"amount_cents": 700}}],
        },
    )


RECONCILE_CASES = {
    # tool, how the operator reconciles, the outcome recorded, the attempt of the one effect
    "by-hand-applied": (
        "test.lost-reply",
        ["--outcome", "applied", "--evidence", "charge ch_1 in the PSP dashboard", "--operator", "eve"],
        "applied",
        1,
    ),
    "by-hand-not-applied": (
        "test.first-send-lost",
        ["--outcome", "not-applied", "--evidence", "no charge in the PSP dashboard", "--operator", "eve"],
        "not_applied",
        2,
    ),
    "from-ledger-applied": ("test.lost-reply", ["--from-ledger", "{effects}"], "applied", 1),
    "from-ledger-not-applied": ("test.first-send-lost", ["--from-ledger", "{effects}"], "not_applied", 2),
    "lookup-applied": ("test.lost-reply", ["--lookup", "--adapters", "el_user_tools:ADAPTERS"], "applied", 1),
    "lookup-not-applied": (
        "test.first-send-lost",
        ["--lookup", "--adapters", "el_user_tools:ADAPTERS"],
        "not_applied",
        2,
    ),
}


@pytest.mark.parametrize(
    ("adapter_type", "how", "expected_outcome", "expected_attempt"),
    RECONCILE_CASES.values(),
    ids=RECONCILE_CASES.keys(),
)
def test_an_uncertain_step_stops_the_run_and_reconcile_lets_it_finish(
    cli: Cli, adapter_type: str, how: list[str], expected_outcome: str, expected_attempt: int
) -> None:
    """A non-idempotent tool whose reply is lost stops the run (exit 3) with a message naming the
    step and the exact reconcile command; ``reconcile`` (by hand, ``--from-ledger`` or ``--lookup``) exits 0 and
    records the outcome; the resumed run completes with exactly one effect, for attempt 1 when it
    was applied and for attempt 2 (a new key) when it was not."""
    run_id = f"user-{expected_outcome}-{how[0].strip('-')}"
    plan = user_plan(cli, run_id, adapter_type)
    tools = ("--adapters", "el_user_tools:ADAPTERS")

    stopped = cli.run(plan, *tools)
    assert 3 == stopped.returncode
    assert "step 'pay' was requested and its outcome is unknown" in stopped.stderr
    assert (
        f"effectlog reconcile --journal {cli.journal} --run-id {run_id} --step pay --attempt 1 "
        "--outcome applied|not-applied --evidence TEXT --operator NAME"
    ) in stopped.stderr
    assert "stopped" == cli.status(run_id)["state"]

    args = [a.format(effects=cli.effects) for a in how]
    reconciled = cli("reconcile", "--journal", cli.journal, "--run-id", run_id, "--step", "pay", *args)
    assert 0 == reconciled.returncode, reconciled.stderr
    event = cli.timeline(run_id)[-1]
    assert ("step.reconciled", expected_outcome) == (event["type"], event["outcome"])
    assert ("--from-ledger" in how or "--lookup" in how) == event.get("automated", False)
    assert ("--lookup" in how) == ("adapter_identity" in event)

    done = cli.run(plan, *tools)

    assert 0 == done.returncode, done.stderr
    assert [(run_id, "pay", expected_attempt)] == [
        (r["run_id"], r["step_id"], r["attempt"]) for r in cli.effects_rows()
    ]
    assert "completed" == cli.status(run_id)["state"]


@pytest.mark.parametrize(
    "how",
    [
        ["--outcome", "applied", "--evidence", "seen", "--operator", "eve"],
        ["--from-ledger", "{effects}"],
    ],
    ids=["by-hand", "from-ledger"],
)
def test_reconciling_a_step_that_is_not_uncertain_exits_2_and_writes_nothing(cli: Cli, how: list[str]) -> None:
    """``reconcile`` of a confirmed step is a clear one-line error (exit 2); nothing is appended."""
    cli.run(EXAMPLES / "payment.json")
    before = cli.timeline("payment-001")

    args = [a.format(effects=cli.effects) for a in how]
    done = cli("reconcile", "--journal", cli.journal, "--run-id", "payment-001", "--step", "charge", *args)

    assert 2 == done.returncode
    assert "cannot reconcile: the step is confirmed, not uncertain" in one_line_error(done)
    assert before == cli.timeline("payment-001")


def test_reconcile_by_hand_needs_outcome_evidence_and_operator(cli: Cli) -> None:
    """A reconciliation is a claim backed by evidence: without --evidence it is refused (exit 2)."""
    cli.run(EXAMPLES / "payment.json")

    done = cli(
        "reconcile", "--journal", cli.journal, "--run-id", "payment-001", "--step", "charge", "--outcome", "applied"
    )

    assert 2 == done.returncode
    assert "--evidence" in one_line_error(done)


# -- conflicts, schema, bad plans ----------------------------------------------------------------


def test_a_different_plan_under_the_same_run_id_exits_5_and_leaves_the_journal_untouched(cli: Cli) -> None:
    """Re-running run id payment-001 with other args is a conflict (exit 5, one line naming the
    plan difference); the journal and its WAL are byte-identical afterwards."""
    cli.run(EXAMPLES / "payment.json")
    raw = json.loads((EXAMPLES / "payment.json").read_text())
    raw["steps"][0]["args"]["amount_cents"] = 99999
    changed = cli.plan("changed.json", raw)
    files = [Path(cli.journal), Path(cli.journal + "-wal")]
    before = [p.read_bytes() if p.exists() else None for p in files]

    done = cli.run(changed)

    assert 5 == done.returncode
    assert "run id reused with a different plan" in one_line_error(done)
    assert before == [p.read_bytes() if p.exists() else None for p in files]


def test_schema_plan_prints_the_plans_json_schema(cli: Cli) -> None:
    """``schema plan`` prints a JSON Schema whose Plan, AdapterDecl, StepDecl and RetryPolicy
    name every documented field."""
    done = cli("schema", "plan")

    assert 0 == done.returncode
    schema = json.loads(done.stdout)
    defs = schema["$defs"]
    assert {
        "Plan": ["adapters", "run_id", "steps"],
        "AdapterDecl": ["idempotent", "options", "type", "version"],
        "StepDecl": ["adapter", "approval", "args", "id", "retry", "secret", "timeout_s"],
        "RetryPolicy": ["attempts", "backoff_base_s", "backoff_cap_s", "jitter"],
    } == {name: sorted(defs[name]["properties"]) for name in ("Plan", "AdapterDecl", "StepDecl", "RetryPolicy")}
    assert "#/$defs/Plan" == schema["$ref"]


BAD_PLANS = {
    "unknown-adapter": (
        {"run_id": "r", "adapters": {"a": {"type": "noop"}}, "steps": [{"id": "s", "adapter": "ledgr"}]},
        "steps[0].adapter: unknown adapter 'ledgr'",
    ),
    "missing-run-id": ({"adapters": {}, "steps": []}, "plan: Object missing required field run_id"),
    "wrong-type": (
        {"run_id": "r", "adapters": {"a": {"type": "noop"}}, "steps": [{"id": "s", "adapter": "a", "timeout_s": "x"}]},
        "steps[0].timeout_s: Expected float | null, got str",
    ),
    "retry-without-idempotency": (
        {
            "run_id": "r",
            "adapters": {"a": {"type": "noop"}},
            "steps": [{"id": "s", "adapter": "a", "retry": {"attempts": 2}}],
        },
        "steps[0].retry: adapter 'a' is not idempotent",
    ),
    "duplicate-step": (
        {
            "run_id": "r",
            "adapters": {"a": {"type": "noop"}},
            "steps": [{"id": "s", "adapter": "a"}, {"id": "s", "adapter": "a"}],
        },
        "steps[1].id: duplicate step id 's'",
    ),
    "unknown-field": (
        {"run_id": "r", "adapters": {"a": {"type": "noop", "verison": "2"}}, "steps": [{"id": "s", "adapter": "a"}]},
        "adapters.a: Object contains unknown field verison",
    ),
    "adapter-field-type": (
        {"run_id": "r", "adapters": {"ok": {"type": "noop"}, "b": {"type": "noop", "version": 3}}, "steps": []},
        "adapters.b.version: Expected str, got int",
    ),
}


@pytest.mark.parametrize(("raw", "expected"), BAD_PLANS.values(), ids=BAD_PLANS.keys())
def test_a_bad_plan_exits_2_with_one_line_naming_the_json_path(cli: Cli, raw: dict[str, Any], expected: str) -> None:
    """A plan that fails validation: exit 2, one line on stderr naming the file and the JSON
    path, no traceback, and the journal is never created."""
    path = cli.plan("bad.json", raw)

    done = cli.run(path)

    assert 2 == done.returncode
    assert f"effectlog: bad_plan: {path}: {expected}" in one_line_error(done)
    assert not Path(cli.journal).exists()


def test_a_plan_that_is_not_json_exits_2_with_one_line(cli: Cli) -> None:
    """Malformed JSON is bad input too: exit 2, one line, no traceback."""
    path = cli.dir / "broken.json"
    path.write_text('{"run_id": "r",')

    done = cli.run(path)

    assert 2 == done.returncode
    assert f"{path}: not valid JSON" in one_line_error(done)


def test_docs_plan_md_documents_every_plan_field_and_builtin_adapter() -> None:
    """docs/plan.md names every field of the plan's JSON Schema and every built-in adapter type,
    so the documentation cannot silently fall behind the format."""
    text = (ROOT / "docs" / "plan.md").read_text()
    defs = msgspec.json.schema(Plan)["$defs"]
    names = {field for d in defs.values() for field in d["properties"]} | set(BUILTINS)

    assert [] == sorted(name for name in names if f"`{name}`" not in text)
