"""Fleet and plain runs share one rule (issue 11, reproduction 6): a fleet request's run is written
only under its lease. A plain `effectlog run` of the same plan against the store, while a real runner
holds the run, is refused with exit 5 naming the request, and writes nothing; after the runner
finishes, each step's effect happened once and the request succeeded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from effectlog.adapters.effects import EffectStore
from effectlog.errors import ExitStatus
from effectlog.fleet import FleetStore
from fleet_kit import RunnerProcess, effectlog, snapshot, write_plan

pytest_plugins = ["pg_fixture", "fleet_kit"]
pytestmark = pytest.mark.crash

FAST = ("--lease-s", "2.0", "--heartbeat-s", "0.2", "--poll-s", "0.05")


def unchanged(store: FleetStore, tmp_path: Path) -> dict[str, object]:
    """What the refused run could have changed: everything but the lease's expiry, which heartbeats renew."""
    seen = snapshot(store, "run-f", tmp_path / "effects.db")
    seen["attempts"] = [(a.attempt_id, a.state, a.runner_id, a.token) for a in seen["attempts"]]
    return seen


def test_a_plain_run_of_a_fleet_run_is_refused_while_a_runner_holds_it(
    store_url: str, store: FleetStore, tmp_path: Path
) -> None:
    """The runner stops after step a's effect (lease held); `run --journal STORE` exits 5, naming request 1,
    and changes nothing; resumed, the runner completes the run with one effect per step."""
    plan = write_plan(tmp_path / "p.json", "run-f", [("a", "control"), ("b", "control")])
    effectlog("submit", str(plan), "--store", store_url, "--scope", "s", "--key", "k")
    runner = RunnerProcess(
        store_url, tmp_path, "A", arm="after_effect", resumable=True, extra=(*FAST, "--max-attempts", "1")
    )
    try:
        assert "after_effect a" == runner.reached()
        before = unchanged(store, tmp_path)
        effects = str(tmp_path / "effects.db")
        done = effectlog("run", str(plan), "--journal", store_url, "--effects", effects, check=False)
        assert int(ExitStatus.CONFLICT) == done.returncode, done.stderr
        assert "fleet request 1" in done.stderr
        assert "Traceback" not in done.stderr
        assert before == unchanged(store, tmp_path)
        runner.resume()
        assert 0 == runner.wait()
    finally:
        runner.stop()
    assert "succeeded" == store.request(1).state
    ledger = EffectStore(tmp_path / "effects.db")
    try:
        assert [("a", 1), ("b", 1)] == [(r.step_id, r.attempt) for r in ledger.rows()]
    finally:
        ledger.close()
