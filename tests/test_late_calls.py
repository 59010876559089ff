"""A call that timed out goes on in its thread, and may still make its effect (``effectlog.latecalls``).

Round 13 found two effects for one non-idempotent step: the call timed out (the step stopped
uncertain), a lookup asked while it was still in flight said "not applied", the next run made
attempt 2's effect, and then the first call landed. These tests prove the mechanism that closes
it: while a timed-out call of a run still runs in this process, this runtime refuses to drive or
decide the run (``call_still_running``, exit 6, nothing written), the run's claim is kept (another
process's decision is refused, exit 6), ``close`` keeps both until the call ends, and once it has
ended the lookup sees its effect: one effect in all."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from effectlog.errors import CallStillRunning, ExitStatus
from effectlog.journal import open_journal
from effectlog.plan import Plan, parse_plan
from effectlog.runtime import Runtime
from hardening_kit import SAFETY_TIMEOUT_S
from test_attack_round13 import LATE_CALLS, RELEASE, _Late, late_released  # noqa: F401 (a fixture)
from test_lifecycle import effect_counts

ADAPTERS = {"test.late": lambda decl, ctx: _Late(ctx)}


def _plan() -> Plan:
    return parse_plan(
        b'{"run_id": "pay-1", "adapters": {"bank": {"type": "test.late"}},'
        b' "steps": [{"id": "pay", "adapter": "bank", "args": {"n": 1}, "timeout_s": 0.2}]}'
    )


def _events(journal: Path) -> int:
    j = open_journal(str(journal), writer=False)
    try:
        return len(list(j.read("pay-1")))
    finally:
        j.close()


def _reconcile_elsewhere(journal: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "effectlog", "reconcile", "--journal", str(journal), "--run-id", "pay-1"]
    argv += ["--step", "pay", "--outcome", "not-applied", "--evidence", "ledger empty", "--operator", "ops"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S)


pytestmark = pytest.mark.usefixtures("late_released")


def test_nothing_decides_a_run_while_its_timed_out_call_still_runs(tmp_path: Path) -> None:
    """Proves: while the call runs, the lookup, a resume and a decision by hand in this runtime are each
    refused with ``call_still_running`` (exit 6) and a decision from another process with exit 6,
    nothing written; once the call has ended, the lookup finds its effect and the run completes
    without a second attempt: one effect."""
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    with Runtime(str(journal), effects=effects, adapters=ADAPTERS) as rt:
        assert "stopped" == rt.run(_plan()).state
        written = _events(journal)
        refused = []
        for decide in (
            lambda: rt.reconcile_by_lookup("pay-1", "pay"),
            lambda: rt.run(_plan()),
            lambda: rt.reconcile("pay-1", "pay", outcome="not_applied", evidence="none seen", operator="ops"),
        ):
            with pytest.raises(CallStillRunning) as info:
                decide()
            refused.append((info.value.code, info.value.exit_status))
        elsewhere = _reconcile_elsewhere(journal)
        assert [("call_still_running", ExitStatus.LOCKED)] * 3 == refused
        assert (ExitStatus.LOCKED, written) == (elsewhere.returncode, _events(journal)), elsewhere.stderr
        RELEASE.set()
        LATE_CALLS[0].join(SAFETY_TIMEOUT_S)
        step = rt.reconcile_by_lookup("pay-1", "pay").step("pay")
        assert step is not None
        assert ("reconciled", "applied", "completed") == (step.state, step.outcome, rt.run(_plan()).state)
    assert Counter({("pay-1", "pay"): 1}) == effect_counts(effects)


def test_closing_the_runtime_keeps_the_claim_until_the_late_call_ends(tmp_path: Path) -> None:
    """Proves: ``close`` returns at once, and until the call ends another process still cannot decide
    the run (exit 6); after it ends, the runtime has closed and the decision goes through."""
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    rt = Runtime(str(journal), effects=effects, adapters=ADAPTERS)
    assert "stopped" == rt.run(_plan()).state
    rt.close()
    held = _reconcile_elsewhere(journal)
    RELEASE.set()
    LATE_CALLS[0].join(SAFETY_TIMEOUT_S)
    closer = [t for t in threading.enumerate() if t.name == "effectlog-late-close"]
    for thread in closer:
        thread.join(SAFETY_TIMEOUT_S)
    after = _reconcile_elsewhere(journal)
    assert (ExitStatus.LOCKED, 0) == (held.returncode, after.returncode), (held.stderr, after.stderr)
