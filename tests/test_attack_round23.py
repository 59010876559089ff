"""Round-23 attacks: a ledger that is not the run's own, and keys that ignore the body. Each test is
one suspicion: a failing reproduction first where it found a defect. Real SQLite files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from effectlog.adapters.effects import EffectStore
from effectlog.errors import LookupUndecided
from effectlog.outcome import SimulatedCrash
from effectlog.plan import parse_plan
from effectlog.runtime import Runtime


def _stop_at(step_id: str, point: str):  # type: ignore[no-untyped-def]
    def hook(where: str, sid: str) -> None:
        if where == point and sid == step_id:
            raise SimulatedCrash(where)

    return hook


def _pay_plan(card: str) -> object:
    return parse_plan(
        json.dumps(
            {
                "run_id": "pay-1",
                "adapters": {"bank": {"type": "effects.control"}},
                "steps": [{"id": "pay", "adapter": "bank", "args": {"card": card, "n": 1}, "secret": ["card"]}],
            }
        ).encode()
    )


def test_a_lookup_of_a_step_with_secret_args_takes_no_other_journals_effect_under_the_same_run_id(
    tmp_path: Path,
) -> None:
    """Two journals share one effect store and each has a run ``pay-1`` whose step ``pay`` has a
    secret arg (another card). Journal A's payment is made. Journal B's pass stops after its request,
    before the effect (B's payment was never sent). ``reconcile_by_lookup`` on B without the plan
    (the secret is then only a placeholder) asked the ledger with no body to compare, found A's row
    under the same run, step and attempt, and recorded B's payment as applied: a payment lost while
    ``verify`` says ok. Proves: the ledger compares the journal's args digest of the real args, so
    A's row is another body (the step stays uncertain, exit 3, nothing recorded) and B's payment is
    made on the next pass."""
    effects = tmp_path / "e.db"
    with Runtime(str(tmp_path / "a.db"), effects=effects) as rt:
        assert "completed" == rt.run(_pay_plan("4111-A")).state
    b_plan = _pay_plan("5500-B")
    with (
        Runtime(str(tmp_path / "b.db"), effects=effects, crash_hook=_stop_at("pay", "after_request")) as rt,
        pytest.raises(SimulatedCrash),
    ):
        rt.run(b_plan)
    with Runtime(str(tmp_path / "b.db"), effects=effects) as rt:
        assert "stopped" == rt.run(b_plan).state  # requested, no outcome: uncertain
        with pytest.raises(LookupUndecided, match="another body"):  # A's row: no evidence for B, nothing recorded
            rt.reconcile_by_lookup("pay-1", "pay")
        rt.reconcile("pay-1", "pay", outcome="not_applied", evidence="bank statement: no B payment", operator="op")
        assert "completed" == rt.run(b_plan).state
    store = EffectStore(str(effects), read_only=True)
    try:
        assert 2 == store.count(run_id="pay-1", step_id="pay")  # A's payment and B's, each once
    finally:
        store.close()
