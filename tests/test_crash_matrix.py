"""The crash matrix: real workers, real SIGKILL, effects counted in the effect store.

These run the whole matrix (every case, on SQLite and on PostgreSQL) and a soak
of 50 random kills on every CI run. They are slower than the unit tests and are
marked ``crash``; nothing here is skipped.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from effectlog.crashmatrix.cases import CASES
from effectlog.crashmatrix.report import Report, load_report, verify
from effectlog.testing import run_crash_matrix

pytest_plugins = ["pg_fixture"]
pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

# The published crash matrix effectlog reproduces: case -> final effects.
PUBLISHED = {
    "idempotent-after-request": 1,
    "idempotent-after-effect": 1,
    "idempotent-after-confirm": 1,
    "control-after-request": 0,
    "control-after-effect": 1,
    "control-after-confirm": 1,
    "blind-retry": 2,
    "control-no-crash": 1,
}


def effectlog(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectlog", *args], capture_output=True, text=True, timeout=900, check=False, env=env
    )


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory, pg_cluster: Any) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("matrix") / "crash-matrix.json"
    url = pg_cluster.create_database()
    done = effectlog(
        "crash-matrix",
        "run",
        "--backend",
        "sqlite",
        "--backend",
        "postgres",
        "--postgres-url",
        url,
        "--output",
        str(out),
        "--jobs",
        "2",
        "--workdir",
        str(out.parent / "cases"),
    )
    return out, done


def test_matrix_reproduces_the_published_counts_on_every_backend(matrix: Any) -> None:
    """Each of the source's eight cases ends with the published number of effects, per backend."""
    out, done = matrix
    assert 0 == done.returncode, done.stderr[-2000:]
    report = load_report(out)
    found = {(c.name, c.backend): c.effects for c in report.cases}
    for name, effects in PUBLISHED.items():
        backends = ["none"] if name == "blind-retry" else ["sqlite", "postgres"]
        for backend in backends:
            assert effects == found[(name, backend)], (name, backend)


def test_every_case_runs_on_both_backends_and_verifies(matrix: Any) -> None:
    """Every case (the source's and ours) is in the report for each backend, and verify finds nothing wrong."""
    out, _ = matrix
    report = load_report(out)
    expected = {(c.name, b) for c in CASES if c.journal for b in ("sqlite", "postgres")}
    expected |= {(c.name, "none") for c in CASES if not c.journal}
    assert expected == {(c.name, c.backend) for c in report.cases}
    assert [] == verify(report)
    done = effectlog("crash-matrix", "verify", str(out))
    assert 0 == done.returncode, done.stderr


def test_armed_workers_were_killed_by_sigkill_after_reporting_their_point(matrix: Any) -> None:
    """Every armed worker told the parent it reached its point and then died of signal 9."""
    report = load_report(matrix[0])
    armed = [p for c in report.cases for p in c.processes if p.arm is not None]
    assert len(armed) >= len(CASES)
    assert all(p.reached == p.arm and p.signal == 9 and p.exit_status is None for p in armed)


def test_report_records_environment_and_source_digests(matrix: Any) -> None:
    """The report carries Python and SQLite versions, the platform and sha256 of the runtime's sources."""
    report = load_report(matrix[0])
    env = report.environment
    assert env is not None
    assert env.python == sys.version.split()[0]
    assert "runtime.py" in env.source_sha256
    assert 64 == len(env.runtime_sha256)


def _tamper(report: Report, how: str) -> Report:
    bad = copy.deepcopy(report)
    case = next(c for c in bad.cases if c.name == "control-after-request" and c.backend == "sqlite")
    if how == "count-changed":
        case.effects = 1
    elif how == "event-removed":
        case.events.pop(2)
    elif how == "row-added":
        dup = next(c for c in bad.cases if c.name == "control-no-crash" and c.backend == "sqlite")
        case.effect_rows.append({**dup.effect_rows[0], "run_id": case.run_id})
        case.effects = 1
    elif how == "flag-flipped":
        case.ok = not case.ok
    elif how == "case-dropped":
        bad.cases.remove(case)
    elif how == "event-edited":
        e = case.events[1]
        case.events[1] = msgspec.structs.replace(e, body=e.body.replace('"adapter":"tool"', '"adapter":"tooo"'))
    return bad


@pytest.mark.parametrize(
    "how", ["count-changed", "event-removed", "row-added", "flag-flipped", "case-dropped", "event-edited"]
)
def test_a_report_edited_by_hand_fails_verify(matrix: Any, tmp_path: Path, how: str) -> None:
    """verify recomputes from evidence: any hand edit of counts, events, rows or flags is caught (exit 7)."""
    report = load_report(matrix[0])
    bad = tmp_path / "tampered.json"
    bad.write_bytes(msgspec.json.encode(_tamper(report, how)))
    done = effectlog("crash-matrix", "verify", str(bad))
    assert 7 == done.returncode
    assert "control-after-request" in done.stderr


@pytest.mark.parametrize(
    "text",
    [
        '{"run_id": "r1", "adapters": {}, "steps": []}',  # a plan, the file next to the report
        "{}",
        '{"version": 1, "cases": []}',  # no backends: what it was run against is not said
    ],
)
def test_a_file_that_is_not_a_report_is_bad_input_not_a_failed_verification(tmp_path: Path, text: str) -> None:
    """A JSON object that is not a crash-matrix report (a plan, ``{}``) is bad input naming the file
    (exit 2), not a report whose cases are missing (exit 7, the exit for a report that does not hold):
    every field of a report has a default, so any object decoded as an empty report."""
    wrong = tmp_path / "p.json"
    wrong.write_text(text)
    done = effectlog("crash-matrix", "verify", str(wrong))
    assert (2, 1) == (done.returncode, len(done.stderr.splitlines())), done.stderr
    assert f"effectlog: bad_input: {wrong}: not a crash-matrix report" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_committed_report_verifies() -> None:
    """experiments/results/crash-matrix.json came from a real run, and still verifies from its evidence."""
    committed = ROOT / "experiments" / "results" / "crash-matrix.json"
    done = effectlog("crash-matrix", "verify", str(committed))
    assert 0 == done.returncode, done.stderr
    assert "Not idempotent: after request | 0 | Stopped, unresolved" in done.stdout


def test_soak_of_fifty_random_kills_has_no_violation(tmp_path: Path) -> None:
    """50 SIGKILLs at random moments, each resumed by a fresh process: every invariant holds."""
    out = tmp_path / "soak.json"
    done = effectlog(
        "crash-matrix", "soak", "--kills", "50", "--seed", "7", "--output", str(out), "--workdir", str(tmp_path / "w")
    )
    assert 0 == done.returncode, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert 0 == result["violations"]
    assert result["kills"] >= 50
    assert result["idempotent_steps"] == result["idempotent_exactly_once"]
    assert result["control_steps"] == result["control_at_most_once"]
    assert 0 == result["unknown_outcomes_reexecuted_without_reconciliation"]
    assert result["confirmed_results"] == result["confirmed_results_surviving"]
    assert result["runs"] == result["runs_verified"]


@pytest.fixture
def ledger_env(tmp_path: Path) -> Any:
    old = dict(os.environ)
    os.environ["EFFECTLOG_TEST_LEDGER"] = str(tmp_path / "ledger.db")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), old.get("PYTHONPATH", "")]))
    yield
    os.environ.clear()
    os.environ.update(old)


def test_a_user_adapter_that_keeps_its_contract_passes(tmp_path: Path, ledger_env: Any) -> None:
    """effectlog.testing.run_crash_matrix: an adapter with a real idempotency contract has one effect per case."""
    report, problems = run_crash_matrix("crash_adapters:keeps_contract", "crash_adapters:count", tmp_path / "w")
    assert [] == problems
    assert {1} == {c.effects for c in report.cases}


def test_a_user_adapter_that_only_declares_idempotency_is_exposed(tmp_path: Path, ledger_env: Any) -> None:
    """Declaring idempotent proves nothing: the matrix finds the duplicated effect after a crash."""
    report, problems = run_crash_matrix(
        "crash_adapters:declares_but_duplicates", "crash_adapters:count", tmp_path / "w"
    )
    by_name = {c.name: c.effects for c in report.cases}
    assert 2 == by_name["user-after-effect"]
    assert any("user-after-effect" in p and "expected 1 effect(s)" in p for p in problems)


def test_user_matrix_from_the_cli(tmp_path: Path, ledger_env: Any) -> None:
    """`crash-matrix run --adapter M:F --ledger M:C` runs the same matrix from the command line."""
    out = tmp_path / "user.json"
    done = effectlog(
        "crash-matrix",
        "run",
        "--adapter",
        "crash_adapters:keeps_contract",
        "--ledger",
        "crash_adapters:count",
        "--output",
        str(out),
        "--workdir",
        str(tmp_path / "w"),
        env=dict(os.environ),
    )
    assert 0 == done.returncode, done.stderr[-2000:]
    assert 0 == effectlog("crash-matrix", "verify", str(out)).returncode


def test_docs_show_the_committed_reports_table() -> None:
    """docs/crash-matrix.md shows exactly the table recomputed from the committed report."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("crash_matrix_docs", ROOT / "experiments" / "crash_matrix_docs.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    block = module.table_block(str(ROOT / "experiments" / "results" / "crash-matrix.json"))
    assert block in (ROOT / "docs" / "crash-matrix.md").read_text()


def test_docs_show_the_committed_soak() -> None:
    """docs/crash-matrix.md shows exactly the committed soak's counts, and that soak had no violation."""
    from effectlog.crashmatrix.soak import SoakResult, render_soak

    result = msgspec.json.decode((ROOT / "experiments" / "results" / "soak.json").read_bytes(), type=SoakResult)
    assert 0 == result.violations
    assert result.kills >= 50
    assert render_soak(result).rstrip() in (ROOT / "docs" / "crash-matrix.md").read_text()
