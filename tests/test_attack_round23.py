"""Round-23 attacks: a ledger that is not the run's own, and keys that ignore the body. Each test is
one suspicion: a failing reproduction first where it found a defect. Real SQLite files."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from effectlog.adapters import Evidence, Receipt, Request, body_bound_key
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


class _KeyedBank:
    """A user's tool that dedups by ``body_bound_key`` (the helper for a tool that keeps keys alone) in
    its own SQLite file, and whose ``lookup`` asks that file for the request's body-bound key."""

    blocking = True

    def __init__(self, path: str) -> None:
        self.path = path
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE IF NOT EXISTS paid (key TEXT PRIMARY KEY, attempt INTEGER)")

    def invoke(self, request: Request) -> Receipt:
        with sqlite3.connect(self.path) as db:
            db.execute("INSERT INTO paid VALUES (?, ?)", (body_bound_key(request), request.attempt))
        return Receipt(data={"paid": True})

    def lookup(self, request: Request) -> Evidence:
        with sqlite3.connect(self.path) as db:
            row = db.execute("SELECT 1 FROM paid WHERE key = ?", (body_bound_key(request),)).fetchone()
        return Evidence(applied=row is not None, detail="bank ledger")


def test_a_lookup_by_body_bound_key_of_a_step_with_secret_args_finds_its_effect(tmp_path: Path) -> None:
    """A user's tool keys its ledger by ``body_bound_key(request)`` and its ``lookup`` asks for that key.
    The payment (a secret card arg) is made and the pass is killed before the outcome. A
    ``reconcile_by_lookup`` without the plan rebuilt the request with the secret as a placeholder, so
    ``body_bound_key`` was another key, the lookup said "not applied", and the next pass paid again: two
    payments, the journal saying one. Proves: the rebuilt request's ``body_digest`` is the journal's
    digest of the real args, so the lookup finds the payment and the next pass sends nothing."""
    bank = str(tmp_path / "bank.db")
    plan = parse_plan(
        json.dumps(
            {
                "run_id": "pay-2",
                "adapters": {"bank": {"type": "test.keyed"}},
                "steps": [{"id": "pay", "adapter": "bank", "args": {"card": "4111", "n": 5}, "secret": ["card"]}],
            }
        ).encode()
    )
    tools = {"test.keyed": lambda decl, ctx: _KeyedBank(bank)}
    journal = str(tmp_path / "j.db")
    with (
        Runtime(journal, adapters=tools, crash_hook=_stop_at("pay", "after_effect")) as rt,
        pytest.raises(SimulatedCrash),
    ):
        rt.run(plan)
    with Runtime(journal, adapters=tools) as rt:
        assert "stopped" == rt.run(plan).state  # the payment's outcome unknown
        decided = rt.reconcile_by_lookup("pay-2", "pay").steps["pay"].state
        assert "completed" == rt.run(plan).state
    with sqlite3.connect(bank) as db:
        assert [(1,)] == db.execute("SELECT attempt FROM paid").fetchall()  # attempt 1's payment, once
    assert "reconciled" == decided  # applied, by the lookup's evidence
