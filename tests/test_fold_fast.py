"""The replay-only fold (``replay_records_fast``, what ``load_run`` and ``verify`` use) gives the
IDENTICAL state to the pure fold (``replay_records``, the reference), and raises the same errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from effectlog import events as ev
from effectlog.adapters import EffectStore
from effectlog.chain import GENESIS, Chain
from effectlog.errors import EffectlogError
from effectlog.fold import Record, RunState, replay_records, replay_records_fast
from effectlog.journal import SqliteJournal, load_run
from effectlog.plan import Plan, parse_plan
from effectlog.runtime import Runtime, SimulatedCrash
from strategies import Walk, build_event, legal_histories, legal_walks, spec_illegal_moves


def records_of(events: list[ev.Event], chain: Chain) -> list[Record]:
    head, out = GENESIS, []
    for event in events:
        body = ev.encode(event)
        head = chain.link(head, body)
        out.append(Record(event.run_id, event.seq, body, head))
    return out


def outcome(fold: Callable[..., RunState], *args: object, **kwargs: object) -> RunState | tuple[str, str, object]:
    """The fold's state, or the error it raised as (type, message, fields): both folds must agree on either."""
    try:
        return fold(*args, **kwargs)
    except EffectlogError as exc:
        return type(exc).__name__, exc.message, (exc.run_id, exc.seq, exc.step_id, exc.fields)


@given(history=legal_histories(max_events=60), keyed=st.booleans())
def test_the_replay_only_fold_equals_the_pure_fold_over_legal_histories(history: list[ev.Event], keyed: bool) -> None:
    """Over random legal histories (every event type, retries, approvals, reconciliations, closings)
    both folds end in the identical state, steps, receipts, timestamps and chain head included."""
    chain = Chain(b"k" if keyed else None)
    records = records_of(history, chain)
    run_id = history[0].run_id
    assert replay_records(records, chain, run_id=run_id) == replay_records_fast(records, chain, run_id=run_id)


@given(history=legal_histories(max_events=60), data=st.data())
def test_the_replay_only_fold_continues_from_any_prefix_state(history: list[ev.Event], data: st.DataObject) -> None:
    """From the pure state of any prefix, the replay-only fold of the rest equals the pure fold of all
    (this is how a resume continues from a checkpoint)."""
    chain = Chain()
    assert_fast_continues_from_any_cut(records_of(history, chain), chain, history[0].run_id, data)


def assert_fast_continues_from_any_cut(records: list[Record], chain: Chain, run_id: str, data: st.DataObject) -> None:
    """The pure fold of a drawn prefix, then the replay-only fold of the rest, equals the pure fold of all."""
    cut = data.draw(st.integers(0, len(records)), label="cut")
    prefix = replay_records(records[:cut], chain, run_id=run_id)
    assert replay_records(records, chain, run_id=run_id) == replay_records_fast(
        records[cut:], chain, prefix, run_id=run_id
    )


@given(walk=legal_walks(max_events=30), data=st.data())
def test_the_replay_only_fold_refuses_what_the_pure_fold_refuses(walk: Walk, data: st.DataObject) -> None:
    """A history ending in an event the specs forbid, a gap or a foreign run id: the same error type,
    message and fields (run, seq, step) from both folds."""
    events = list(walk.events)
    kind = data.draw(st.sampled_from(["illegal", "gap", "foreign"]), label="kind")
    if kind == "illegal":
        moves = spec_illegal_moves(walk)
        if not moves:
            return
        bad = build_event(data.draw, walk, data.draw(st.sampled_from(moves), label="move"))
    else:
        last = events[-1]
        seq = last.seq + 2 if kind == "gap" else last.seq + 1
        run_id = last.run_id if kind == "gap" else "another-run"
        bad = msgspec.structs.replace(ev.RunCancelled(run_id=last.run_id, seq=seq, ts=1, by="x"), run_id=run_id)
    chain = Chain()
    records = records_of([*events, bad], chain)
    run_id = events[0].run_id
    expected = outcome(replay_records, records, chain, run_id=run_id)
    assert isinstance(expected, tuple)
    assert expected == outcome(replay_records_fast, records, chain, run_id=run_id)


@given(history=legal_histories(max_events=40), data=st.data())
def test_the_replay_only_fold_detects_a_changed_byte_as_the_pure_fold_does(
    history: list[ev.Event], data: st.DataObject
) -> None:
    """One changed stored byte: both folds raise the same integrity error at the same seq."""
    chain = Chain()
    records = records_of(history, chain)
    i = data.draw(st.integers(0, len(records) - 1), label="record")
    body = bytearray(records[i].body)
    body[data.draw(st.integers(0, len(body) - 1), label="byte")] ^= data.draw(st.integers(1, 255), label="mask")
    records[i] = msgspec.structs.replace(records[i], body=bytes(body))
    run_id = history[0].run_id
    expected = outcome(replay_records, records, chain, run_id=run_id)
    assert isinstance(expected, tuple)
    assert expected == outcome(replay_records_fast, records, chain, run_id=run_id)


# -- the crash matrix's journals (in process: SimulatedCrash at each boundary, then resume) --------


def crash_plan(run_id: str, adapter_type: str) -> Plan:
    idempotent = "true" if adapter_type == "effects.idempotent" else "false"
    return parse_plan(
        (
            f'{{"run_id": "{run_id}", "adapters": {{"tool": {{"type": "{adapter_type}", "version": "1", '
            f'"idempotent": {idempotent}}}}}, "steps": [{{"id": "a", "adapter": "tool", "args": {{"n": 1}}}}, '
            f'{{"id": "charge", "adapter": "tool", "args": {{"amount_cents": 1299}}}}]}}'
        ).encode()
    )


@pytest.mark.parametrize("point", ["after_request", "after_effect", "after_confirm", "before_commit"])
@pytest.mark.parametrize("adapter_type", ["effects.idempotent", "effects.control"])
def test_the_replay_only_fold_equals_the_pure_fold_on_crash_matrix_journals(
    tmp_path: Path, point: str, adapter_type: str
) -> None:
    """The journals the crash matrix leaves (crashed at each boundary, then resumed; a stopped run
    reconciled from the ledger and resumed again) replay identically through both folds, at every stage."""

    def compare(journal_path: Path, plan: Plan) -> None:
        with SqliteJournal(journal_path, writer=False) as journal:
            records = list(journal.read("crash"))
            assert replay_records(records, journal.chain, run_id="crash") == load_run(journal, "crash")

    through_crash_stages(tmp_path, point, adapter_type, compare)


def through_crash_stages(tmp_path: Path, point: str, adapter_type: str, compare: Callable[[Path, Plan], None]) -> Path:
    """The crash matrix's stages in process: crash ``charge`` at ``point``, resume; a stopped run is
    reconciled from the ledger and resumed to completion. ``compare(journal, plan)`` after each stage."""
    journal_path, effects = tmp_path / "j.db", str(tmp_path / "effects.db")
    plan = crash_plan("crash", adapter_type)
    EffectStore(effects).close()

    def hook(where: str, step_id: str) -> None:
        if step_id == "charge" and where.startswith(point):
            raise SimulatedCrash(where)

    with Runtime(journal_path, effects=effects, crash_hook=hook) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    compare(journal_path, plan)
    with Runtime(journal_path, effects=effects) as rt:
        first = rt.run(plan)
        compare(journal_path, plan)
        if first.state == "stopped":
            rt.reconcile_from_ledger("crash", "charge")
            compare(journal_path, plan)
            assert "completed" == rt.run(plan).state
    compare(journal_path, plan)
    return journal_path


# -- records as a journal reads them back: with their index columns -------------------------------


def read_back_records_of(events: list[ev.Event], chain: Chain) -> list[Record]:
    """``records_of`` with the index columns a journal's ``read`` returns (step_id, phase, attempt)."""
    return [
        msgspec.structs.replace(rec, step_id=event.step_key, phase=event.phase, attempt=event.attempt_no)
        for rec, event in zip(records_of(events, chain), events, strict=True)
    ]


@given(history=legal_histories(max_events=60), data=st.data())
def test_the_replay_only_fold_equals_the_pure_fold_over_records_read_back(
    history: list[ev.Event], data: st.DataObject
) -> None:
    """With the index columns a journal reads back (which the replay-only fold compares inline for the
    step events whose phase is their tag), both folds end in the identical state, from any prefix."""
    chain = Chain()
    assert_fast_continues_from_any_cut(read_back_records_of(history, chain), chain, history[0].run_id, data)


@given(history=legal_histories(max_events=40), data=st.data())
def test_the_replay_only_fold_names_a_moved_index_column_as_the_pure_fold_does(
    history: list[ev.Event], data: st.DataObject
) -> None:
    """One row's step_id, phase or attempt column changed (the body and chain intact): both folds raise
    the same error naming the same column, seq and step."""
    chain = Chain()
    records = read_back_records_of(history, chain)
    i = data.draw(st.integers(0, len(records) - 1), label="record")
    column = data.draw(st.sampled_from(["step_id", "phase", "attempt"]), label="column")
    stored = getattr(records[i], column)
    changed = stored + 1 if column == "attempt" else data.draw(st.sampled_from(["", "x", "step.confirmed"]))
    if changed == stored:
        changed = "y"
    records[i] = msgspec.structs.replace(records[i], **{column: changed})
    run_id = history[0].run_id
    expected = outcome(replay_records, records, chain, run_id=run_id)
    assert isinstance(expected, tuple)
    assert expected[2][3].get("column") == column
    assert expected == outcome(replay_records_fast, records, chain, run_id=run_id)
