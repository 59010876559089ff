"""The crash matrix for a user's own adapter (issue 12): its own args, non-idempotent adapters
reconciled through their own ``lookup``, and a Result column that shows the real failure.

Every case kills real worker processes with SIGKILL and counts effects in the adapter's
own ledger; ``reconcile --lookup`` runs as a separate ``effectlog`` process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from effectlog.testing import run_crash_matrix

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# An idempotent adapter that needs its own argument names: a payment plan's args make it raise KeyError.
# ``Liar`` is not idempotent and its lookup always says "not applied": the matrix must expose it.
TOOLS = """
import os, sqlite3
from effectlog.adapters import Evidence


def _db():
    db = sqlite3.connect(os.environ["EL_USER_LEDGER"], isolation_level=None, timeout=30)
    db.execute("CREATE TABLE IF NOT EXISTS ledger (key TEXT, run_id TEXT, step_id TEXT, recipient TEXT)")
    return db


class NeedsRecipient:
    def invoke(self, request):
        recipient = request.args["recipient"]
        db = _db()
        try:
            db.execute("BEGIN IMMEDIATE")
            if db.execute("SELECT 1 FROM ledger WHERE key = ?", (request.idempotency_key,)).fetchone() is None:
                db.execute("INSERT INTO ledger VALUES (?, ?, ?, ?)",
                           (request.idempotency_key, request.run_id, request.step_id, recipient))
            db.execute("COMMIT")
        finally:
            db.close()
        return {"key": request.idempotency_key}


class Liar:
    def invoke(self, request):
        db = _db()
        try:
            db.execute("INSERT INTO ledger VALUES (?, ?, ?, ?)",
                       (request.idempotency_key, request.run_id, request.step_id, ""))
        finally:
            db.close()
        return {"key": request.idempotency_key}

    def lookup(self, request):
        return Evidence(applied=False, detail="never looked")


def needs_recipient(decl, context):
    return NeedsRecipient()


def liar(decl, context):
    return Liar()


def count(run_id, step_id):
    db = _db()
    try:
        found = db.execute("SELECT count(*) FROM ledger WHERE run_id = ? AND step_id = ?", (run_id, step_id))
        return found.fetchone()[0]
    finally:
        db.close()
"""


@pytest.fixture
def user_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's modules importable by every process the matrix starts, with their ledgers here."""
    (tmp_path / "el_cm_tools.py").write_text(TOOLS)
    path = os.pathsep.join(filter(None, [str(tmp_path), str(EXAMPLES), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("EL_USER_LEDGER", str(tmp_path / "user-ledger.db"))
    monkeypatch.setenv("OUTBOX_LEDGER", str(tmp_path / "outbox.db"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(EXAMPLES))
    return tmp_path


def matrix(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectlog", "crash-matrix", "run", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_a_missing_argument_shows_as_the_failure_not_as_completed(user_env: Path) -> None:
    """With the default payment args an adapter that reads ``recipient`` raises KeyError: the
    matrix exits 1 and every row's Result column names the KeyError, never "Completed"."""
    out = user_env / "report.json"

    done = matrix(
        "--adapter",
        "el_cm_tools:needs_recipient",
        "--ledger",
        "el_cm_tools:count",
        "--output",
        str(out),
        "--workdir",
        str(user_env / "w"),
    )

    assert 1 == done.returncode
    rows = [line for line in done.stdout.splitlines() if line.startswith("| Your adapter")]
    assert 6 == len(rows)
    assert all("KeyError: 'recipient'" in row and row.endswith("| FAIL |") for row in rows), done.stdout
    assert not any("| Completed |" in row for row in rows)


def test_args_give_the_adapter_its_own_arguments(user_env: Path) -> None:
    """``--args JSON`` is the step's args: the same adapter passes every case, the report
    records the args, and ``crash-matrix verify`` recomputes it; bad JSON is exit 2."""
    out = user_env / "report.json"
    given = {"recipient": "acct-7", "amount_cents": 3}

    done = matrix(
        "--adapter",
        "el_cm_tools:needs_recipient",
        "--ledger",
        "el_cm_tools:count",
        "--args",
        json.dumps(given),
        "--output",
        str(out),
        "--workdir",
        str(user_env / "w"),
    )
    bad = matrix(
        "--adapter",
        "el_cm_tools:needs_recipient",
        "--ledger",
        "el_cm_tools:count",
        "--args",
        "[1]",
        "--output",
        str(out),
    )

    assert 0 == done.returncode, done.stdout + done.stderr[-2000:]
    assert given == json.loads(out.read_text())["args"]
    verified = subprocess.run(
        [sys.executable, "-m", "effectlog", "crash-matrix", "verify", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert 0 == verified.returncode, verified.stderr
    assert 2 == bad.returncode
    assert "--args must be a JSON object" in bad.stderr


def test_a_non_idempotent_adapter_is_reconciled_through_its_own_lookup(user_env: Path) -> None:
    """The example outbox (not idempotent, with ``lookup``): every crash that leaves the step
    uncertain is reconciled by ``reconcile --lookup`` and each case ends with one message."""
    from outbox_adapter import create_ledger  # type: ignore[import-not-found]

    create_ledger(str(user_env / "outbox.db"))

    report, problems = run_crash_matrix(
        "outbox_adapter:factory",
        "outbox_adapter:count",
        user_env / "w",
        args={"to": "ada@example.com", "subject": "Welcome"},
        idempotent=False,
    )

    assert [] == problems
    assert {
        "user-control-no-crash": 1,
        "user-control-after-request": 1,
        "user-control-after-effect": 1,
        "user-control-before-commit-effect": 1,
        "user-control-after-confirm": 1,
    } == {c.name: c.effects for c in report.cases}


def test_a_lookup_that_lies_is_exposed(user_env: Path) -> None:
    """A lookup that says "not applied" for an effect that exists makes the resume send again:
    the matrix counts 2 effects in the adapter's own ledger and reports the case as failed."""
    report, problems = run_crash_matrix(
        "el_cm_tools:liar", "el_cm_tools:count", user_env / "w", args={"n": 1}, idempotent=False
    )

    by_name = {c.name: c.effects for c in report.cases}
    assert 2 == by_name["user-control-after-effect"]
    assert any("user-control-after-effect" in p and "expected 1 effect(s)" in p for p in problems)
