"""Review round 7: attacks on a fork's pinned effect store and the re-send of a parent's key.

The change under review (066eae3): a fork pins its parent's effect store, and a retry of a
run that failed on an idempotent step of unknown outcome records that step, in the fork's
first batch, as ``step.requested`` under the PARENT's key (``key_from``), which the fork
re-sends. Each test here is a case the change's own tests did not cover; effects are
counted in the effect store itself (real SQLite files), CLI behaviour through real
``python -m effectlog`` processes.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from effectlog import events as ev
from effectlog.adapters.effects import EffectStore
from effectlog.adapters.protocol import idempotency_key
from effectlog.errors import ExitStatus, ForkRefused, SecretUnavailable
from effectlog.journal import load_run, open_journal
from effectlog.plan import Plan, args_digest, parse_plan
from effectlog.recorder import record_now
from effectlog.runtime import Runtime
from lifecycle_adapters import ADAPTERS, Lossy
from review7_adapters import ADAPTERS as REVIEW7_ADAPTERS
from test_lifecycle import SAFETY_S, effect_counts, effectlog, start, state_of, tags, wait_for, write_plan

pytest_plugins = ["pg_fixture"]

LEDGER = {"type": "effects.control", "version": "1", "idempotent": False}
CLI_ADAPTERS = "lifecycle_adapters:ADAPTERS"


def booking(tmp: Path, *, run_id: str = "book-1", check: bool = True, approval: bool = False) -> Plan:
    """[check (not applied while ``open`` is missing)], reserve (idempotent, answers lost while
    ``answers`` is missing, the effect made once per key), log (an effect on every call)."""
    reserve: dict[str, Any] = {"id": "reserve", "adapter": "api", "args": {"seat": "12A"}}
    if approval:
        reserve["approval"] = "required"
    steps = [{"id": "check", "adapter": "gate"}] if check else []
    steps += [reserve, {"id": "log", "adapter": "ledger", "args": {"n": 1}}]
    return parse_plan(
        json.dumps(
            {
                "run_id": run_id,
                "adapters": {
                    "gate": {"type": "test.gate", "options": {"open": str(tmp / "open")}},
                    "api": {"type": "test.lossy", "idempotent": True, "options": {"answers": str(tmp / "answers")}},
                    "ledger": LEDGER,
                },
                "steps": steps,
            }
        ).encode()
    )


def runs_in(journal: Path) -> list[str]:
    j = open_journal(str(journal), writer=False)
    try:
        return j.runs()
    finally:
        j.close()


def lost_parent(tmp: Path, journal: Path, effects: Path, **kw: Any) -> Plan:
    """Run ``booking``: check passes, reserve's effect is made and its answer lost; the run fails."""
    plan = booking(tmp, **kw)
    (tmp / "open").touch()
    with Runtime(str(journal), effects=effects, adapters=ADAPTERS) as rt:
        failed = rt.run(plan)
        assert ("failed", None) == (failed.state, rt.load(plan.run_id).step("reserve").applied)
    assert 1 == effect_counts(effects)[(plan.run_id, "reserve")]
    return plan


# -- a fork from before the lost step that ends before reaching it ------------------------


def fork_written_by_066eae3(journal: Path, plan: Plan, child: str) -> None:
    """What 066eae3's `effectlog fork --from-step check` wrote when `check` failed: the fork closed with
    `reserve` requested (the parent's key, ``key_from``) in its first batch and never sent.

    Written with the recorder, event for event as that code did (run.started, step.requested
    for reserve; then check requested, failed, run failed), since the code no longer makes
    such a fork (see the test after next); journals written by it keep them.
    """
    j = open_journal(str(journal))
    try:
        parent = load_run(j, plan.run_id)
        reserve, mine = parent.step("reserve"), msgspec.structs.replace(plan, run_id=child)
        started = {"plan": mine.pinned(), "plan_digest": mine.digest, "adapters": parent.adapters}
        lineage = {"forked_from": plan.run_id, "from_step": "check", "by": "ops", "reason": "check again"}
        resent = {"step_id": "reserve", "attempt": 1, "adapter": "api", "idempotency_key": reserve.idempotency_key}
        resent |= {"args_digest": reserve.args_digest, "idempotent": True, "key_from": plan.run_id}
        state = record_now(
            j,
            load_run(j, child),
            [(ev.RunStarted, {**started, "effect_store": parent.effect_store, **lineage}), (ev.StepRequested, resent)],
            time.time_ns,
        )
        why = "not applied: the gate is closed"
        check = {"step_id": "check", "attempt": 1, "adapter": "gate", "idempotent": False}
        check |= {"idempotency_key": idempotency_key(child, "check", 1), "args_digest": args_digest(mine.step("check"))}
        record_now(j, state, [(ev.StepRequested, check)], time.time_ns)
        failed = {"step_id": "check", "attempt": 1, "reason": why, "applied": False}
        record_now(
            j,
            load_run(j, child),
            [(ev.StepFailed, failed), (ev.RunFailed, {"step_id": "check", "reason": why})],
            time.time_ns,
        )
    finally:
        j.close()


def test_a_fork_that_ends_before_its_resent_step_can_be_retried_and_the_effect_happens_once(tmp_path: Path) -> None:
    """A closed fork holding its parent's lost step requested, never sent, is retried: the reservation is made once.

    066eae3 recorded the lost step ``requested`` under the parent's key in a fork's first
    batch, ahead of the steps a fork from an earlier step runs first; when one of those
    failed, the fork closed with that step requested and never sent. Its retry was refused
    ("requested ... resume or reconcile it first"), yet a closed run is never resumed and
    only an uncertain step is reconciled: a dead end, contrary to docs/lifecycle.md ("the
    fork ... can be retried in turn"). A requested step of an idempotent tool in a closed
    run has an unknown outcome under its key exactly as a lost one does: the retry sends
    that same key again.
    """
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    plan = lost_parent(tmp_path, journal, effects)
    fork_written_by_066eae3(journal, plan, "book-1.f")
    assert ("failed", "requested") == (
        state_of(journal, "book-1.f").state,
        state_of(journal, "book-1.f").steps["reserve"].state,
    )
    (tmp_path / "answers").touch()
    common = ("--journal", str(journal), "--adapters", CLI_ADAPTERS, "--effects", str(effects))
    done = effectlog("retry", "--run-id", "book-1.f", "--by", "ops", "--reason", "again", *common)
    assert ExitStatus.DONE == done.returncode, done.stderr
    keys = {r: state_of(journal, r).steps["reserve"].idempotency_key for r in ("book-1", "book-1.f", "book-1.f.retry1")}
    assert 1 == len(set(keys.values())), keys
    assert "completed" == state_of(journal, "book-1.f.retry1").state
    assert 1 == sum(n for (_, step), n in effect_counts(effects).items() if step == "reserve")
    assert 0 == effectlog("verify", "--journal", str(journal)).returncode


# -- the parent's key re-sent through another implementation ----------------------------------


class UpgradedLossy(Lossy):
    """``test.lossy`` after an upgrade that moved its endpoint: the new one keeps its own key table
    (here: the key under another namespace), so it has never seen a key the old one was sent."""

    def invoke(self, request: Any) -> Any:
        moved = msgspec.structs.replace(request, idempotency_key=f"v2/{request.idempotency_key}")
        return super().invoke(moved)


def test_a_parents_key_is_not_resent_through_an_implementation_other_than_the_one_it_was_sent_to(
    tmp_path: Path,
) -> None:
    """A retry whose idempotent tool's implementation changed since the parent sent the key is refused.

    A resume of a requested step with a changed adapter is refused (``plan_mismatch``), and
    ``repin`` is refused while a step is requested (lifecycle/repin.py: "that step was
    started by the old implementation and must be finished ... under it"), because a new
    implementation may do something else with the same key. The fork's re-send of its
    parent's key skipped that check: the upgraded tool did not know the key and reserved the
    seat a second time. Refused now (exit 5), nothing written, one reservation.
    """
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    lost_parent(tmp_path, journal, effects, check=False)
    (tmp_path / "answers").touch()
    upgraded = {**ADAPTERS, "test.lossy": lambda decl, ctx: UpgradedLossy(decl.options, ctx)}
    with Runtime(str(journal), effects=effects, adapters=upgraded) as rt:
        with pytest.raises(ForkRefused, match="'api'") as info:
            rt.retry("book-1", by="ops", reason="endpoint upgraded")
        assert (ExitStatus.CONFLICT, ["book-1"]) == (info.value.exit_status, rt.journal.runs())
    assert Counter({("book-1", "reserve"): 1}) == effect_counts(effects)


# -- real processes: a fork killed with the key in hand, two forks sending it at once ------------

HELD = "review7_adapters:ADAPTERS"


def held_parent(tmp: Path, journal: Path, effects: Path) -> tuple[str, ...]:
    """``effectlog run`` of reserve (``test.heldlossy``) then log: reserve's answer lost, the run fails.
    Returns the common CLI arguments (journal, adapters, effects)."""
    options = {"answers": str(tmp / "answers"), "sent": str(tmp / "sent"), "hold": str(tmp / "hold")}
    plan = {
        "run_id": "book-1",
        "adapters": {"api": {"type": "test.heldlossy", "idempotent": True, "options": options}, "ledger": LEDGER},
        "steps": [
            {"id": "reserve", "adapter": "api", "args": {"seat": "12A"}},
            {"id": "log", "adapter": "ledger", "args": {"n": 1}},
        ],
    }
    common = ("--journal", str(journal), "--adapters", HELD, "--effects", str(effects))
    ran = effectlog("run", str(write_plan(tmp, plan)), *common)
    assert ExitStatus.RUN_FAILED == ran.returncode, ran.stderr
    assert Counter({("book-1", "reserve"): 1}) == effect_counts(effects)
    return common


def test_a_retry_killed_with_the_parents_key_in_hand_is_recovered_and_sends_that_key_once_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL of `effectlog retry` inside the re-send; `effectlog recover` re-sends the same key: one effect.

    The fork is left open with the step requested (the parent's key, one re-send recorded);
    recovery resumes it from the plan its journal pinned (and from a checkpoint segment: one
    at every batch, ``EFFECTLOG_CHECKPOINT_EVERY=1``) and sends that key again, never a new
    one: one reservation across parent and fork, the fork completed, the journal verified.
    """
    monkeypatch.setenv("EFFECTLOG_CHECKPOINT_EVERY", "1")
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    common = held_parent(tmp_path, journal, effects)
    (tmp_path / "hold").touch()
    retry = start("retry", "--run-id", "book-1", "--by", "ops", "--reason", "again", *common)
    wait_for(tmp_path / "sent-book-1.retry1", retry)
    retry.send_signal(signal.SIGKILL)
    retry.communicate(timeout=SAFETY_S)
    child = state_of(journal, "book-1.retry1")
    parent_key = state_of(journal, "book-1").steps["reserve"].idempotency_key
    assert ("running", "requested", 1) == (child.state, child.steps["reserve"].state, child.steps["reserve"].resends)
    (tmp_path / "hold").unlink()
    (tmp_path / "answers").touch()
    recovered = effectlog("recover", *common, "--json")
    assert 0 == recovered.returncode, recovered.stderr
    assert [("book-1.retry1", "resumed", "completed")] == [
        (r["run_id"], r["action"], r["state"]) for r in json.loads(recovered.stdout)
    ]
    assert parent_key == state_of(journal, "book-1.retry1").steps["reserve"].idempotency_key
    assert 2 == tags(journal, "book-1.retry1").count("step.resent")
    assert Counter({("book-1", "reserve"): 1, ("book-1.retry1", "log"): 1}) == effect_counts(effects)
    assert 0 == effectlog("verify", "--journal", str(journal)).returncode


def test_two_forks_of_one_parent_sending_its_key_at_the_same_time_make_one_effect(tmp_path: Path) -> None:
    """Two `effectlog fork` processes of one failed parent, both held with the parent's key, released together.

    Both re-send the same key at once; the tool deduplicates it: one reservation, and both
    forks record the same receipt (its effect id). (Each fork's later steps are its own, run
    on purpose: an explicit fork says so.)
    """
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    common = held_parent(tmp_path, journal, effects)
    (tmp_path / "hold").touch()
    (tmp_path / "answers").touch()
    forks = {
        name: start("fork", "--run-id", "book-1", "--new-run-id", name, "--by", "ops", "--reason", "both", *common)
        for name in ("f1", "f2")
    }
    for name, proc in forks.items():
        wait_for(tmp_path / f"sent-{name}", proc)
    (tmp_path / "hold").unlink()
    outputs = {name: proc.communicate(timeout=SAFETY_S) for name, proc in forks.items()}
    assert {"f1": 0, "f2": 0} == {name: proc.returncode for name, proc in forks.items()}, outputs
    receipts = {name: state_of(journal, name).steps["reserve"].receipt["effect_id"] for name in forks}
    assert 1 == len(set(receipts.values())), receipts
    assert Counter({("book-1", "reserve"): 1, ("f1", "log"): 1, ("f2", "log"): 1}) == effect_counts(effects)


# -- secrets, PostgreSQL ------------------------------------------------------------------------


def secret_booking(tmp: Path) -> Plan:
    """reserve (idempotent, answers lost) with a secret arg, then log: the journal holds the card's digest."""
    return parse_plan(
        json.dumps(
            {
                "run_id": "book-1",
                "adapters": {
                    "api": {"type": "test.lossy", "idempotent": True, "options": {"answers": str(tmp / "answers")}},
                    "ledger": LEDGER,
                },
                "steps": [
                    {"id": "reserve", "adapter": "api", "args": {"seat": "12A", "card": "4111"}, "secret": ["card"]},
                    {"id": "log", "adapter": "ledger", "args": {"n": 1}},
                ],
            }
        ).encode()
    )


def test_a_retry_resends_a_step_with_secret_args_only_with_the_same_values_supplied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-sent step's secret arg comes from the whole plan given, or the environment; another value is refused.

    With no value the retry is refused by name (nothing written); with the whole plan given
    (``plan=``) the key is re-sent with the real args, which the tool finds under the
    parent's key with the same body: one reservation.
    """
    monkeypatch.delenv("EFFECTLOG_SECRET_CARD", raising=False)
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    plan = secret_booking(tmp_path)
    with Runtime(str(journal), effects=effects, adapters=ADAPTERS) as rt:
        assert "failed" == rt.run(plan).state
    (tmp_path / "answers").touch()
    with Runtime(str(journal), effects=effects, adapters=ADAPTERS) as rt:
        with pytest.raises(SecretUnavailable, match="EFFECTLOG_SECRET_CARD"):
            rt.retry("book-1", by="ops", reason="again")
        monkeypatch.setenv("EFFECTLOG_SECRET_CARD", "5500")
        with pytest.raises(SecretUnavailable, match="not the submitted one"):
            rt.retry("book-1", by="ops", reason="again")
        assert ["book-1"] == rt.journal.runs()
        assert "completed" == rt.retry("book-1", by="ops", reason="again", plan=plan).state
    assert Counter({("book-1", "reserve"): 1, ("book-1.retry1", "log"): 1}) == effect_counts(effects)


def test_postgres_a_retry_whose_resent_key_is_lost_again_is_retried_with_that_key_once_more(
    tmp_path: Path, pg_url: str
) -> None:
    """On PostgreSQL, the key chain: parent lost, its retry lost again, the retry's retry answered: one effect.

    Every run of the chain records `reserve` under the first parent's key; each fork's
    ``key_from`` names the run it was forked from.
    """
    effects = tmp_path / "e.db"
    plan = booking(tmp_path, check=False)
    with Runtime(pg_url, effects=effects, adapters=ADAPTERS) as rt:
        assert "failed" == rt.run(plan).state
        assert "failed" == rt.retry("book-1", by="ops", reason="x").state
        (tmp_path / "answers").touch()
        assert "completed" == rt.retry("book-1.retry1", by="ops", reason="y").state
        chain = ("book-1", "book-1.retry1", "book-1.retry1.retry1")
        keys = {rt.load(r).step("reserve").idempotency_key for r in chain}
        froms = [
            e.key_from
            for r in chain[1:]
            for e in (ev.decode(x.body) for x in rt.journal.read(r))
            if isinstance(e, ev.StepRequested) and e.step_id == "reserve"
        ]
    assert (1, ["book-1", "book-1.retry1"]) == (len(keys), froms)
    assert Counter({("book-1", "reserve"): 1, ("book-1.retry1.retry1", "log"): 1}) == effect_counts(effects)


# -- the store a retry is given ----------------------------------------------------------------


def test_a_retry_given_an_empty_file_for_its_store_is_refused_and_leaves_the_file_empty(tmp_path: Path) -> None:
    """`effectlog retry --effects F`, F an existing empty file (not the parent's store): refused, F untouched.

    The missing-path check ran before the adapters opened the store, but an existing file
    passed it, and the adapters' writer open made it a new effect store (schema and a new
    store id) before ``refuse_other_store`` refused it: a refused command changed a file
    (20 KB of effectlog tables in a file the user named by mistake). The store is now
    identified read-only first. Also: when the pinned store itself moved away, the message
    no longer tells the user to give the very path that is missing.
    """
    journal, effects, empty = tmp_path / "j.db", tmp_path / "e.db", tmp_path / "empty.db"
    lost_parent(tmp_path, journal, effects, check=False)
    empty.touch()
    common = ("--journal", str(journal), "--adapters", CLI_ADAPTERS)
    refused = effectlog("retry", "--run-id", "book-1", "--by", "ops", "--reason", "x", *common, "--effects", str(empty))
    assert (ExitStatus.BAD_INPUT, 1) == (refused.returncode, len(refused.stderr.strip().splitlines())), refused.stderr
    assert "not an effect store" in refused.stderr
    assert (0, ["book-1"]) == (empty.stat().st_size, runs_in(journal))
    moved = tmp_path / "moved.db"
    effects.rename(moved)
    gone = effectlog("retry", "--run-id", "book-1", "--by", "ops", "--reason", "x", *common, "--effects", str(effects))
    assert ExitStatus.CONFLICT == gone.returncode, gone.stderr
    assert f"give --effects {effects}" not in gone.stderr, gone.stderr
    assert not effects.exists()


def test_a_parents_key_is_not_resent_when_the_parent_pinned_no_store_and_the_fork_is_given_one(
    tmp_path: Path,
) -> None:
    """The parent pinned no effect store (a run recorded before stores were pinned; here its tool keeps
    its keys in a store it opens itself): refused.

    The parent's key was recorded in ``e.db``, but its ``run.started`` names no store, so
    nothing can tell whether the store a retry is given is that one. The retry given
    another store re-sent the key there, where it was unknown: a second reservation (before
    066eae3 this retry was refused). Now refused (exit 5), nothing written.
    """
    journal, effects, other = tmp_path / "j.db", tmp_path / "e.db", tmp_path / "other.db"
    EffectStore(other).close()
    plan = parse_plan(
        json.dumps(
            {
                "run_id": "book-1",
                "adapters": {
                    "api": {
                        "type": "test.ownstorelossy",
                        "idempotent": True,
                        "options": {"answers": str(tmp_path / "a"), "store": str(effects)},
                    }
                },
                "steps": [{"id": "reserve", "adapter": "api", "args": {"seat": "12A"}}],
            }
        ).encode()
    )
    with Runtime(str(journal), adapters=REVIEW7_ADAPTERS) as rt:
        assert "failed" == rt.run(plan).state
        assert rt.load("book-1").effect_store is None
    (tmp_path / "a").touch()
    with Runtime(str(journal), effects=other, adapters=REVIEW7_ADAPTERS) as rt:
        with pytest.raises(ForkRefused, match="pinned no effect store") as info:
            rt.retry("book-1", by="ops", reason="again")
        assert (ExitStatus.CONFLICT, ["book-1"]) == (info.value.exit_status, rt.journal.runs())
    assert (Counter({("book-1", "reserve"): 1}), Counter()) == (effect_counts(effects), effect_counts(other))


def test_a_fork_from_an_earlier_step_does_not_take_its_parents_unknown_effect_as_its_own(tmp_path: Path) -> None:
    """`effectlog fork --from-step check` past a lost `reserve`: refused (exit 5), nothing written.

    A fork from an earlier step runs the steps from there again on purpose, under its own
    keys (docs/lifecycle.md): a confirmed `reserve` would be made again. A lost one was sent
    again under the PARENT's key, so the tool answered with the parent's reservation: the
    fork ("same booking again") recorded `reserve` confirmed with a receipt that is the
    parent's effect, and the reservation it asked for was silently never made. Whether the
    parent's key landed is unknown, so neither key is right without the operator: retry
    the run first (the parent's key sent again, its outcome settled), then fork that run.
    """
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    lost_parent(tmp_path, journal, effects)
    (tmp_path / "answers").touch()
    common = ("--journal", str(journal), "--adapters", CLI_ADAPTERS, "--effects", str(effects))
    fork = ("fork", "--run-id", "book-1", "--new-run-id", "book-2", "--from-step", "check")
    done = effectlog(*fork, "--by", "ops", "--reason", "same booking again", *common)
    assert (ExitStatus.CONFLICT, 1) == (done.returncode, len(done.stderr.strip().splitlines())), done.stderr
    assert [] == [w for w in ("fork_refused", "'reserve'", "Retry the run first") if w not in done.stderr], done.stderr
    assert ["book-1"] == runs_in(journal)
    assert Counter({("book-1", "reserve"): 1}) == effect_counts(effects)
    # The way on the message gives: the retry settles the parent's key, the fork of the retry books again.
    assert 0 == effectlog("retry", "--run-id", "book-1", "--by", "ops", "--reason", "settle", *common).returncode
    fork = ("fork", "--run-id", "book-1.retry1", "--new-run-id", "book-2", "--from-step", "check")
    again = effectlog(*fork, "--by", "ops", "--reason", "same booking again", *common)
    assert 0 == again.returncode, again.stderr
    reserved = Counter({("book-1", "reserve"): 1, ("book-2", "reserve"): 1})
    assert reserved == Counter({k: n for k, n in effect_counts(effects).items() if k[1] == "reserve"})
