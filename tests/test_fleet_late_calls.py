"""A fleet runner whose non-idempotent call timed out but still runs keeps the attempt's lease until the
call ends (``effectlog.latecalls``; the runner half of round 13's duplicated effect).

The runner escalated the attempt (``needs_operator``) as soon as the step stopped uncertain, while the
call went on in its thread and could still make its effect: an operator who looked at the ledger then
saw nothing, reconciled "not applied", requeued, and the retry charged a second time when the late
call landed too. Now the runner holds the lease (its heartbeats go on) until the call has ended, so the
run cannot be decided meanwhile; then it escalates, and the ledger shows the late effect: one charge."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from effectlog.fleet import FleetStore
from effectlog.journal import load_run
from fleet_kit import RunnerProcess, effectlog, wait_until
from test_fleet_processes import FAST, effect_rows

pytest_plugins = ["pg_fixture", "fleet_kit"]
pytestmark = pytest.mark.crash

# A non-idempotent tool that says it started, then answers only once the test releases it, making its
# effect (in the runner's effect store) then, as a slow remote service would.
_LATE_MODULE = """
import os, time


class Late:
    def __init__(self, ctx):
        self.ctx = ctx

    def invoke(self, request):
        open(os.environ["EL_STARTED"], "w").close()
        while not os.path.exists(os.environ["EL_RELEASE"]):
            time.sleep(0.02)
        return self.ctx.effect_store().apply_control(request)


ADAPTERS = {"test.late": lambda decl, ctx: Late(ctx)}
"""


def _state(store: FleetStore, step_id: str) -> str | None:
    step = load_run(store.journal(), "pay-1").step(step_id)
    return step.state if step is not None else None


def test_a_runner_keeps_the_lease_until_its_timed_out_call_ends_and_the_charge_is_made_once(
    store_url: str, store: FleetStore, runners: list[RunnerProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: while the timed-out call runs, the step is recorded uncertain but the attempt stays
    leased and a reconciliation by hand is refused (nothing written); after the call ends, the request
    needs an operator, the ledger holds the late charge, and ``reconcile --from-ledger`` records it
    applied: one charge in all."""
    (tmp_path / "el_late_fleet.py").write_text(_LATE_MODULE)
    monkeypatch.setenv("PYTHONPATH", ":".join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    started, release = tmp_path / "started", tmp_path / "release"
    monkeypatch.setenv("EL_STARTED", str(started))
    monkeypatch.setenv("EL_RELEASE", str(release))
    plan = {
        "run_id": "pay-1",
        "adapters": {"bank": {"type": "test.late"}},
        "steps": [{"id": "charge", "adapter": "bank", "args": {"cents": 500}, "timeout_s": 0.3}],
    }
    (tmp_path / "pay.json").write_text(json.dumps(plan))
    effectlog("submit", str(tmp_path / "pay.json"), "--store", store_url, "--scope", "shop", "--key", "order-1")
    runner = RunnerProcess(store_url, tmp_path, "A", extra=(*FAST, "--adapters", "el_late_fleet:ADAPTERS"))
    runners.append(runner)
    wait_until(lambda: _state(store, "charge") == "uncertain" or None,
               "the timed-out step to be recorded uncertain")  # fmt: skip
    by_hand = effectlog(
        "reconcile", "--journal", store_url, "--run-id", "pay-1", "--step", "charge", "--outcome", "not-applied",
        "--evidence", "ledger: nothing for attempt 1", "--operator", "ops", check=False,
    )  # fmt: skip
    leased = [a.state for a in store.attempts()]
    release.touch()
    wait_until(lambda: store.requests(["needs_operator"]) or None, "the request to need an operator")
    from_ledger = effectlog(
        "reconcile", "--journal", store_url, "--run-id", "pay-1", "--step", "charge",
        "--from-ledger", str(tmp_path / "effects.db"), check=False,
    )  # fmt: skip
    assert (True, ["running"]) == (by_hand.returncode != 0, leased), by_hand.stdout + by_hand.stderr
    assert 0 == from_ledger.returncode, from_ledger.stderr
    step = load_run(store.journal(), "pay-1").steps["charge"]
    assert (True, "reconciled", "applied") == (started.exists(), step.state, step.outcome)
    assert [("pay-1", "charge", 1)] == effect_rows(tmp_path / "effects.db")
