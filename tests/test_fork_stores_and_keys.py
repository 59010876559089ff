"""A fork's effect store and keys: what a retry may send, and where its evidence may come from.

A fork (``effectlog fork``/``retry``) is a new run that carries its parent's results. Three
things follow, each proved here with real SQLite files and effects counted in the effect
store itself:

- the fork pins its effect store as any run does, so ``reconcile --from-ledger`` of a
  fork's uncertain step refuses a ledger that is not the run's own (before, the fork pinned
  nothing and any store's "no such effect" was taken as "not applied": the step ran twice);
- the fork runs against its parent's store: carried receipts and keys live there;
- a step of an idempotent tool that failed with an unknown outcome in the parent (every
  send of its key lost) is no longer a dead end: the retry sends it again under the
  parent's key, which the tool deduplicates, so the effect happens once. A tool that is
  not idempotent stays refused: its unknown outcome needs a reconciliation.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from effectlog import events as ev
from effectlog.adapters.effects import EffectStore
from effectlog.errors import ExitStatus, LedgerMismatch
from effectlog.journal import open_journal
from effectlog.outcome import SimulatedCrash
from effectlog.plan import Plan, parse_plan
from effectlog.runtime import Runtime
from lifecycle_adapters import ADAPTERS
from test_lifecycle import effect_counts

LEDGER = {"type": "effects.control", "version": "1", "idempotent": False}


def gated(tmp: Path, run_id: str = "order-1") -> Plan:
    """charge (an effect), ship (not applied until ``open`` exists), email (an effect)."""
    return parse_plan(
        json.dumps(
            {
                "run_id": run_id,
                "adapters": {"ledger": LEDGER, "gate": {"type": "test.gate", "options": {"open": str(tmp / "open")}}},
                "steps": [
                    {"id": "charge", "adapter": "ledger", "args": {"n": 1}},
                    {"id": "ship", "adapter": "gate"},
                    {"id": "email", "adapter": "ledger", "args": {"n": 2}},
                ],
            }
        ).encode()
    )


def _child_plan(plan: Plan, child: str = "order-1.retry1") -> Plan:
    """The plan a fork runs: its parent's, under the fork's run id (resumed as any run)."""
    return msgspec.structs.replace(plan, run_id=child)


def crash_at(point: str, step_id: str) -> Any:
    def hook(where: str, sid: str) -> None:
        if (where, sid) == (point, step_id):
            raise SimulatedCrash(where)

    return hook


def test_a_forks_uncertain_step_is_not_reconciled_from_a_ledger_that_is_not_its_own(tmp_path: Path) -> None:
    """The retry's `email` effect is made, then the process dies; a foreign store's "no such effect" is refused.

    The attack: a second, empty effect store given to ``reconcile --from-ledger`` said
    "not applied" for the fork's uncertain step, and the next resume emailed again (two
    effects). Now the fork pins its store, the foreign ledger is ``ledger_mismatch``, nothing
    is recorded, and the run's own ledger reconciles the step as applied: one email.
    """
    journal, effects, foreign = tmp_path / "j.db", tmp_path / "e.db", tmp_path / "other.db"
    EffectStore(foreign).close()
    plan = gated(tmp_path)
    with Runtime(str(journal), effects=effects, adapters=ADAPTERS) as rt:
        assert "failed" == rt.run(plan).state
    (tmp_path / "open").touch()
    hook = crash_at("after_effect", "email")
    crashed = pytest.raises(SimulatedCrash)
    with Runtime(str(journal), effects=effects, adapters=ADAPTERS, crash_hook=hook) as rt, crashed:
        rt.retry("order-1", by="ops", reason="carrier back up")
    with Runtime(str(journal), effects=effects, adapters=ADAPTERS) as rt:
        child = rt.load("order-1.retry1")
        assert child.effect_store is not None
        assert EffectStore(effects).store_id == child.effect_store.store_id
        assert "stopped" == rt.run(_child_plan(plan)).state
        before = rt.load("order-1.retry1")
        with pytest.raises(LedgerMismatch) as info:
            rt.reconcile_from_ledger("order-1.retry1", "email", str(foreign))
        assert ExitStatus.CONFLICT == info.value.exit_status
        assert before == rt.load("order-1.retry1")
        assert "reconciled" == rt.reconcile_from_ledger("order-1.retry1", "email", str(effects)).step("email").state
        assert "completed" == rt.run(_child_plan(plan)).state
    assert 1 == effect_counts(effects)[("order-1.retry1", "email")]


def test_a_fork_runs_against_its_parents_effect_store_or_not_at_all(tmp_path: Path) -> None:
    """A retry given another effect store, or a path with none, is refused (ledger_mismatch, exit 5).

    Nothing is written: no fork in the journal, no effect, and no empty store made at a
    mistyped path.

    The parent's carried receipts and keys live in the store it pinned; a fork writing its
    effects elsewhere would leave its evidence split across two ledgers.
    """
    journal, effects, other = tmp_path / "j.db", tmp_path / "e.db", tmp_path / "other.db"
    EffectStore(other).close()
    with Runtime(str(journal), effects=effects, adapters=ADAPTERS) as rt:
        assert "failed" == rt.run(gated(tmp_path)).state
    (tmp_path / "open").touch()
    with Runtime(str(journal), effects=other, adapters=ADAPTERS) as rt:
        with pytest.raises(LedgerMismatch, match="not the one the run pinned") as info:
            rt.retry("order-1", by="ops", reason="carrier back up")
        assert (ExitStatus.CONFLICT, ["order-1"]) == (info.value.exit_status, rt.journal.runs())
    assert Counter({("order-1", "charge"): 1}) == effect_counts(effects)
    assert Counter() == effect_counts(other)
    missing = tmp_path / "mistyped.db"
    with Runtime(str(journal), effects=missing, adapters=ADAPTERS) as rt:
        with pytest.raises(LedgerMismatch, match="does not exist"):
            rt.retry("order-1", by="ops", reason="carrier back up")
        assert ["order-1"] == rt.journal.runs()
    assert not missing.exists()


def lossy(tmp: Path, *, idempotent: bool = True) -> Plan:
    """reserve (an idempotent tool whose answers are lost until ``answers`` exists), then log (an effect)."""
    options = {"answers": str(tmp / "answers")}
    return parse_plan(
        json.dumps(
            {
                "run_id": "book-1",
                "adapters": {
                    "api": {"type": "test.lossy", "idempotent": idempotent, "options": options},
                    "ledger": LEDGER,
                },
                "steps": [
                    {"id": "reserve", "adapter": "api", "args": {"seat": "12A"}, "retry": {"attempts": 2}},
                    {"id": "log", "adapter": "ledger", "args": {"n": 1}},
                ],
            }
        ).encode()
    )


def test_a_retry_sends_an_idempotent_step_of_unknown_outcome_again_under_its_parents_key(tmp_path: Path) -> None:
    """The parent sent `reserve` twice, each answer lost: failed, outcome unknown. The retry re-sends that key.

    One reservation in the effect store (the tool deduplicated the third send), the
    fork's `reserve` recorded with the parent's key and ``key_from`` naming the parent, the
    fork completes, and the parent is unchanged. Before, this retry was refused and no
    command could go on without repeating the run's earlier steps under a new run id.
    """
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    plan = lossy(tmp_path)
    with Runtime(str(journal), effects=effects, adapters=ADAPTERS) as rt:
        failed = rt.run(plan)
        parent = rt.load("book-1")
        reserve = parent.step("reserve")
        assert ("failed", None) == (failed.state, reserve.applied)
        assert 1 == effect_counts(effects)[("book-1", "reserve")]
        (tmp_path / "answers").touch()
        done = rt.retry("book-1", by="ops", reason="the endpoint answers again")
        assert "completed" == done.state
        child = rt.load("book-1.retry1")
        assert parent == rt.load("book-1")
    assert reserve.idempotency_key == child.step("reserve").idempotency_key
    assert Counter({("book-1", "reserve"): 1, ("book-1.retry1", "log"): 1}) == effect_counts(effects)
    j = open_journal(str(journal), writer=False)
    try:
        sent = [e for e in (ev.decode(r.body) for r in j.read("book-1.retry1")) if isinstance(e, ev.StepRequested)]
    finally:
        j.close()
    assert [("reserve", "book-1", reserve.idempotency_key), ("log", "", child.step("log").idempotency_key)] == [
        (e.step_id, e.key_from, e.idempotency_key) for e in sent
    ]


def test_a_retry_that_dies_after_resending_the_parents_key_sends_it_again_on_resume(tmp_path: Path) -> None:
    """A SIGKILL-equivalent crash after the fork's re-send: resuming the fork sends the same key once more.

    Still one reservation: the key is the parent's in every send, before and after the crash.
    """
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    plan = lossy(tmp_path)
    with Runtime(str(journal), effects=effects, adapters=ADAPTERS) as rt:
        assert "failed" == rt.run(plan).state
    (tmp_path / "answers").touch()
    hook = crash_at("after_effect", "reserve")
    crashed = pytest.raises(SimulatedCrash)
    with Runtime(str(journal), effects=effects, adapters=ADAPTERS, crash_hook=hook) as rt, crashed:
        rt.retry("book-1", by="ops", reason="again")
    with Runtime(str(journal), effects=effects, adapters=ADAPTERS) as rt:
        assert "completed" == rt.run(_child_plan(plan, "book-1.retry1")).state
        keys = {rt.load(r).step("reserve").idempotency_key for r in ("book-1", "book-1.retry1")}
    assert 1 == len(keys)
    assert 1 == effect_counts(effects)[("book-1", "reserve")]
