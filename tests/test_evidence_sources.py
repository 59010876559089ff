"""Evidence that cannot lie (issue 12, items 1-3), end to end as real CLI processes.

1. A key names one request: the built-in effect store refuses a known key with another
   body (``IdempotencyConflict``, exit 5) instead of reporting a charge that never happened.
2. A run pins its effect store: ``reconcile --from-ledger`` refuses any other file (an
   application's database: exit 2; another run's effect store: exit 5), writes nothing
   to it, and the resume does not send the effect again.
3. ``reconcile --lookup`` asks the step's own adapter, built as the run pinned it, with
   the recorded request (real args, key, attempt); ``None`` keeps the step uncertain.
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

from effectlog.adapters import EffectStore, Request, body_bound_key, body_digest, check_same_body
from effectlog.errors import IdempotencyConflict

pytest_plugins = ["pg_fixture"]

# A user's tool whose reply is lost after the effect: a non-idempotent step becomes uncertain.
# It records what ``lookup`` was asked, so the test can see the request it received.
TOOLS_MODULE = """
import json, os
from effectlog.adapters import Evidence


class LostReply:
    def __init__(self, store):
        self.store = store

    def invoke(self, request):
        self.store.apply_control(request)
        raise ConnectionError("connection reset after the effect")

    def lookup(self, request):
        with open(os.environ["EL_LOOKUP_LOG"], "a") as f:
            f.write(json.dumps({"args": request.args, "key": request.idempotency_key,
                                "attempt": request.attempt}) + "\\n")
        if os.environ.get("EL_LOOKUP_UNDECIDED"):
            return None
        return self.store.lookup(request)


class NoLookup:
    def invoke(self, request):
        raise ConnectionError("connection reset")


ADAPTERS = {
    "test.lost-reply": lambda decl, ctx: LostReply(ctx.effect_store()),
    "test.no-lookup": lambda decl, ctx: NoLookup(),
}
"""


class Cli:
    def __init__(self, root: Path, journal: str | None = None) -> None:
        self.dir = root
        self.journal = journal or str(root / "journal.db")
        (root / "el_evidence_tools.py").write_text(TOOLS_MODULE)
        path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
        self.env = {**os.environ, "PYTHONPATH": path, "EL_LOOKUP_LOG": str(root / "lookups.jsonl")}
        self.env.pop("EFFECTLOG_JOURNAL_KEY", None)

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "effectlog", *args],
            cwd=self.dir,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def plan(self, name: str, raw: dict[str, Any]) -> str:
        (self.dir / name).write_text(json.dumps(raw))
        return name

    def timeline(self, run_id: str, journal: str | None = None) -> list[dict[str, Any]]:
        done = self("timeline", "--journal", journal or self.journal, "--run-id", run_id, "--json")
        assert 0 == done.returncode, done.stderr
        events: list[dict[str, Any]] = json.loads(done.stdout)
        return events


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert 1 == len(lines), done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def charge_plan(run_id: str, amount: int) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "adapters": {"ledger": {"type": "effects.idempotent", "idempotent": True}},
        "steps": [{"id": "charge", "adapter": "ledger", "args": {"amount_cents": amount, "currency": "EUR"}}],
    }


def lost_reply_plan(run_id: str, adapter_type: str = "test.lost-reply") -> dict[str, Any]:
    return {
        "run_id": run_id,
        "adapters": {"mail": {"type": adapter_type, "idempotent": False}},
        "steps": [{"id": "email", "adapter": "mail", "args": {"to": "customer@example.com", "n": 1}}],
    }


TOOLS = ("--adapters", "el_evidence_tools:ADAPTERS")


# -- 1. keys bound to the body --------------------------------------------------------------


def test_a_known_key_with_another_body_is_refused_not_reported_as_done(tmp_path: Path) -> None:
    """Same run id and step id, 5 then 50000 cents, two journals, one effect store: the second
    run exits 5 (IdempotencyConflict) with a one-line message; its journal says failed, not
    confirmed; the ledger holds only the 5-cent charge, and no journal claims the other."""
    cli = Cli(tmp_path)
    a, b = cli.plan("a.json", charge_plan("pay-1", 5)), cli.plan("b.json", charge_plan("pay-1", 50000))

    first = cli("run", a, "--journal", "ja.db", "--effects", "shared.db")
    second = cli("run", b, "--journal", "jb.db", "--effects", "shared.db", "--json")

    assert 0 == first.returncode, first.stderr
    outcome = json.loads(second.stdout)
    assert (5, "failed") == (second.returncode, outcome["state"])
    assert "idempotency conflict" in outcome["message"]
    assert "another request body" in outcome["message"]
    failed = [e for e in cli.timeline("pay-1", "jb.db") if e["type"] == "step.failed"]
    assert [False] == [e["applied"] for e in failed]
    assert not any(e["type"] == "step.confirmed" for e in cli.timeline("pay-1", "jb.db"))
    store = EffectStore(tmp_path / "shared.db")
    try:
        rows = store.rows()
    finally:
        store.close()
    assert [body_digest(_request({"amount_cents": 5, "currency": "EUR"}))] == [r.args_digest for r in rows]


def test_the_same_body_under_a_known_key_still_replays(tmp_path: Path) -> None:
    """The body check does not break de-duplication: the same request again (another journal,
    same run, step and args) gets the stored receipt, marked replayed, and no second effect."""
    cli = Cli(tmp_path)
    a = cli.plan("a.json", charge_plan("pay-1", 5))

    assert 0 == cli("run", a, "--journal", "ja.db", "--effects", "shared.db").returncode
    again = cli("run", a, "--journal", "jb.db", "--effects", "shared.db")

    assert 0 == again.returncode, again.stderr
    effected = [e for e in cli.timeline("pay-1", "jb.db") if e["type"] == "step.effected"]
    assert [True] == [e["receipt"]["replayed"] for e in effected]


def _request(args: dict[str, Any], key: str = "el1-k") -> Request:
    return Request(run_id="r", step_id="s", attempt=1, idempotency_key=key, args=args)


@pytest.mark.parametrize(
    ("first", "second", "conflict"),
    [
        ({"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}, False),  # key order is not part of the body
        ({"amount_cents": 5}, {"amount_cents": 50000}, True),
        ({"amount_cents": 5}, {"amount_cents": 5, "note": ""}, True),
        ({"n": 1}, {"n": 1.5}, True),
    ],
)
def test_check_same_body_compares_canonical_bodies(
    first: dict[str, Any], second: dict[str, Any], conflict: bool
) -> None:
    """The helper for adapter authors compares canonical digests: key order never matters, any
    other difference is an IdempotencyConflict (exit 5); ``body_bound_key`` differs exactly then."""
    recorded = body_digest(_request(first))
    if conflict:
        with pytest.raises(IdempotencyConflict, match="my tool: idempotency key el1-k") as raised:
            check_same_body(_request(second), recorded, where="my tool")
        assert 5 == raised.value.exit_status
    else:
        check_same_body(_request(second), recorded, where="my tool")
    assert conflict == (body_bound_key(_request(first)) != body_bound_key(_request(second)))


# -- 2. the run pins its effect store -----------------------------------------------------------


def _stopped_email_run(cli: Cli, run_id: str, effects: str = "effects.db") -> str:
    plan = cli.plan(f"{run_id}.json", lost_reply_plan(run_id))
    stopped = cli("run", plan, "--journal", cli.journal, "--effects", effects, *TOOLS)
    assert 3 == stopped.returncode, stopped.stderr
    return plan


def _app_database(path: Path) -> bytes:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, email TEXT)")
    db.execute("INSERT INTO customers (email) VALUES ('customer@example.com')")
    db.commit()
    db.close()
    return path.read_bytes()


def _emails(cli: Cli, run_id: str) -> int:
    store = EffectStore(cli.dir / "effects.db", read_only=True)
    try:
        return store.count(run_id=run_id)
    finally:
        store.close()


@pytest.mark.parametrize("wrong", ["application-database", "another-runs-store"])
def test_from_ledger_refuses_a_file_that_is_not_the_runs_store(tmp_path: Path, wrong: str) -> None:
    """``--from-ledger`` with an application's own SQLite database exits 2, with another run's
    effect store exits 5; neither file changes by a byte (no effects table created), nothing
    is appended to the journal, and the resume still stops (exit 3) without a second email."""
    cli = Cli(tmp_path)
    plan = _stopped_email_run(cli, "mail-1")
    if wrong == "application-database":
        other, expected_status = tmp_path / "app.db", 2
        before = _app_database(other)
    else:
        other, expected_status = tmp_path / "other-effects.db", 5
        _stopped_email_run(Cli(tmp_path, str(tmp_path / "other-journal.db")), "mail-2", "other-effects.db")
        before = other.read_bytes()
    events_before = cli.timeline("mail-1")

    refused = cli(
        "reconcile", "--journal", cli.journal, "--run-id", "mail-1", "--step", "email", "--from-ledger", str(other)
    )
    resumed = cli("run", plan, "--journal", cli.journal, "--effects", "effects.db", *TOOLS)

    assert expected_status == refused.returncode, refused.stderr
    assert f"--from-ledger {other}" in one_line(refused)
    assert before == other.read_bytes()
    if wrong == "application-database":  # not even a -wal or -shm beside the application's file
        assert ["app.db"] == sorted(p.name for p in tmp_path.glob("app.db*"))
    assert events_before == cli.timeline("mail-1")[: len(events_before)]
    assert "step.reconciled" not in [e["type"] for e in cli.timeline("mail-1")]
    assert 3 == resumed.returncode
    assert 1 == _emails(cli, "mail-1")


def test_run_started_pins_the_store_and_its_own_store_still_reconciles(tmp_path: Path) -> None:
    """``run.started`` records the effect store's id (written into the store at creation) and
    path; ``--from-ledger`` with that store records the answer, naming the store id."""
    cli = Cli(tmp_path)
    plan = _stopped_email_run(cli, "mail-1")
    store = EffectStore(tmp_path / "effects.db", read_only=True)
    store_id = store.store_id
    store.close()

    done = cli(
        "reconcile", "--journal", cli.journal, "--run-id", "mail-1", "--step", "email", "--from-ledger", "effects.db"
    )

    assert 0 == done.returncode, done.stderr
    events = cli.timeline("mail-1")
    assert {"store_id": store_id, "path": "effects.db"} == events[0]["effect_store"]
    assert store_id.startswith("es-")
    assert store_id in events[-1]["evidence"]
    assert 0 == cli("run", plan, "--journal", cli.journal, "--effects", "effects.db", *TOOLS).returncode
    assert 1 == _emails(cli, "mail-1")


def test_resuming_with_another_effect_store_is_refused(tmp_path: Path) -> None:
    """A resume given another effect store than the pinned one exits 5 before anything is sent:
    the same key sent to another store would be a second effect."""
    cli = Cli(tmp_path)
    held = charge_plan("pay-2", 5)  # an open run: held for approval before its charge
    held["steps"][0]["approval"] = "required"
    plan2 = cli.plan("b.json", held)
    assert 4 == cli("run", plan2, "--journal", cli.journal, "--effects", "effects.db").returncode
    before = cli.timeline("pay-2")

    done = cli("run", plan2, "--journal", cli.journal, "--effects", "elsewhere.db")

    assert 5 == done.returncode
    assert "is not the one the run pinned" in one_line(done)
    assert before == cli.timeline("pay-2")


# -- 3. through the step's own adapter ------------------------------------------------------


def test_lookup_asks_the_steps_own_adapter_with_the_recorded_request(tmp_path: Path) -> None:
    """``reconcile --lookup`` builds the pinned adapter, calls ``lookup`` with the real args,
    key and attempt, and records ``applied`` with ``automated: true`` and the adapter's identity;
    the resume completes with the one email."""
    cli = Cli(tmp_path)
    plan = _stopped_email_run(cli, "mail-1")
    requested = next(e for e in cli.timeline("mail-1") if e["type"] == "step.requested")

    done = cli("reconcile", "--journal", cli.journal, "--run-id", "mail-1", "--step", "email", "--lookup", *TOOLS)

    assert 0 == done.returncode, done.stderr
    asked = [json.loads(line) for line in (tmp_path / "lookups.jsonl").read_text().splitlines()]
    expected = {"args": {"to": "customer@example.com", "n": 1}, "key": requested["idempotency_key"], "attempt": 1}
    assert [expected] == asked
    event = cli.timeline("mail-1")[-1]
    started = cli.timeline("mail-1")[0]
    assert ("step.reconciled", "applied", True) == (event["type"], event["outcome"], event["automated"])
    assert started["adapters"]["mail"] == event["adapter_identity"]
    assert "automated lookup by adapter 'mail'" in event["evidence"]
    assert 0 == cli("run", plan, "--journal", cli.journal, "--effects", "effects.db", *TOOLS).returncode
    assert 1 == _emails(cli, "mail-1")


def test_lookup_that_cannot_tell_keeps_the_step_uncertain(tmp_path: Path) -> None:
    """``lookup`` returning None: exit 3, one line saying it cannot tell and how to reconcile by
    hand; nothing appended; the resume still stops without sending again."""
    cli = Cli(tmp_path)
    plan = _stopped_email_run(cli, "mail-1")
    before = cli.timeline("mail-1")

    done = cli(
        "reconcile",
        "--journal",
        cli.journal,
        "--run-id",
        "mail-1",
        "--step",
        "email",
        "--lookup",
        *TOOLS,
        env={"EL_LOOKUP_UNDECIDED": "1"},
    )

    assert 3 == done.returncode
    line = one_line(done)
    assert "cannot tell" in line
    assert "effectlog reconcile --journal" in line
    assert before == cli.timeline("mail-1")
    assert 3 == cli("run", plan, "--journal", cli.journal, "--effects", "effects.db", *TOOLS).returncode
    assert 1 == _emails(cli, "mail-1")


@pytest.mark.parametrize(
    ("extra", "status", "words"),
    [
        ((), 2, "no adapter of type 'test.no-lookup' is registered"),
        (TOOLS, 2, "has no lookup(request)"),
    ],
    ids=["adapter-not-given", "adapter-without-lookup"],
)
def test_lookup_refusals_write_nothing(tmp_path: Path, extra: tuple[str, ...], status: int, words: str) -> None:
    """Without the adapter's module, or with an adapter that has no ``lookup``, ``--lookup``
    is a one-line error (exit 2) and nothing is appended."""
    cli = Cli(tmp_path)
    plan = cli.plan("p.json", lost_reply_plan("mail-1", "test.no-lookup"))
    assert 3 == cli("run", plan, "--journal", cli.journal, *TOOLS).returncode
    before = cli.timeline("mail-1")

    done = cli("reconcile", "--journal", cli.journal, "--run-id", "mail-1", "--step", "email", "--lookup", *extra)

    assert status == done.returncode
    assert words in one_line(done)
    assert before == cli.timeline("mail-1")


def test_lookup_refuses_another_implementation_than_the_pinned_one(tmp_path: Path) -> None:
    """An adapter module changed since the run pinned it: its lookup is no evidence (exit 5)."""
    cli = Cli(tmp_path)
    _stopped_email_run(cli, "mail-1")
    module = tmp_path / "el_evidence_tools.py"
    module.write_text(module.read_text() + "\n# changed\n")
    before = cli.timeline("mail-1")

    done = cli("reconcile", "--journal", cli.journal, "--run-id", "mail-1", "--step", "email", "--lookup", *TOOLS)

    assert 5 == done.returncode
    assert "not the implementation the run pinned" in one_line(done)
    assert before == cli.timeline("mail-1")


def test_lookup_and_pinned_store_on_postgres(tmp_path: Path, pg_url: str) -> None:
    """The same on a PostgreSQL journal: the store is pinned, another store is refused (exit 5),
    ``--lookup`` records the adapter's answer and the resume completes with one email."""
    cli = Cli(tmp_path, pg_url)
    _app_database(tmp_path / "app.db")
    plan = _stopped_email_run(cli, "mail-pg")
    _stopped_email_run(Cli(tmp_path, str(tmp_path / "other-journal.db")), "mail-2", "other-effects.db")

    wrong = cli(
        "reconcile", "--journal", pg_url, "--run-id", "mail-pg", "--step", "email", "--from-ledger", "other-effects.db"
    )
    done = cli("reconcile", "--journal", pg_url, "--run-id", "mail-pg", "--step", "email", "--lookup", *TOOLS)

    assert 5 == wrong.returncode, wrong.stderr
    assert 0 == done.returncode, done.stderr
    assert 0 == cli("run", plan, "--journal", pg_url, "--effects", "effects.db", *TOOLS).returncode
    assert 1 == _emails(cli, "mail-pg")


def test_from_ledger_refuses_a_run_whose_adapters_keep_their_own_records(tmp_path: Path) -> None:
    """A run that uses no effect store (its adapter keeps its own records) pinned none: any
    effect store given to ``--from-ledger`` is no evidence for it (exit 2, pointing to
    ``--lookup``), and nothing is written."""
    cli = Cli(tmp_path)
    plan = cli.plan("p.json", lost_reply_plan("mail-1", "test.no-lookup"))
    assert 3 == cli("run", plan, "--journal", cli.journal, *TOOLS).returncode
    _stopped_email_run(Cli(tmp_path, str(tmp_path / "other-journal.db")), "mail-2", "other-effects.db")
    before = (tmp_path / "other-effects.db").read_bytes()

    done = cli(
        "reconcile",
        "--journal",
        cli.journal,
        "--run-id",
        "mail-1",
        "--step",
        "email",
        "--from-ledger",
        "other-effects.db",
    )

    assert 2 == done.returncode
    assert "uses no effect store" in one_line(done)
    assert "--lookup" in one_line(done)
    assert before == (tmp_path / "other-effects.db").read_bytes()


def test_a_run_recorded_before_store_ids_still_resumes_and_reconciles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old runs stay usable: a run whose ``run.started`` pinned no store, with an effect store
    that has no id yet, still stops on its uncertain step, is reconciled from that store and
    completes with one effect (the key formula did not change, so its recorded key still holds); its
    first resume pins the store it was given (``run.resumed.effect_store``)."""
    from effectlog.adapters.registry import AdapterContext
    from effectlog.plan import parse_plan
    from effectlog.runtime import Runtime, SimulatedCrash

    raw = {
        "run_id": "old-1",
        "adapters": {"notify": {"type": "effects.control", "idempotent": False}},
        "steps": [{"id": "email", "adapter": "notify", "args": {"to": "a@example.com"}}],
    }
    plan = parse_plan(json.dumps(raw).encode())
    journal, effects = tmp_path / "journal.db", tmp_path / "effects.db"

    def crash(point: str, step_id: str) -> None:
        if point == "after_effect":
            raise SimulatedCrash(point)

    with monkeypatch.context() as old_code:  # what the previous version wrote: no store pinned
        old_code.setattr(AdapterContext, "pinned_store", lambda self: None)
        with Runtime(journal, effects=effects, crash_hook=crash) as runtime, pytest.raises(SimulatedCrash):
            runtime.run(plan)
    db = sqlite3.connect(effects)
    db.execute("DROP TABLE effect_store")  # a store created before store ids
    db.commit()
    db.close()

    with Runtime(journal, effects=effects) as runtime:
        assert 3 == runtime.run(plan).exit_status
        assert "applied" == runtime.reconcile_from_ledger("old-1", "email").step("email").outcome  # type: ignore[union-attr]
        assert 0 == runtime.run(plan).exit_status
        pinned = runtime.load("old-1").effect_store  # the first resume pinned the store it was given
    assert pinned is not None
    assert str(effects) == pinned.path
    store = EffectStore(effects, read_only=True)
    try:
        assert 1 == store.count(run_id="old-1")
    finally:
        store.close()
