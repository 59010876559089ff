"""The one-pass replay over stored rows (``fold.fold_rows``, what ``verify`` and ``load_run`` run over
SQLite's ``read_rows``): the states it yields at its stops are the pure fold's at those seqs with the
steps changed in between, and every tamper of the rows (a byte of a body or a hash, a column, a row
dropped, duplicated or swapped) is refused with the pure fold's error, at the same seq and column."""

from __future__ import annotations

import tempfile
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from effectlog import events as ev
from effectlog.chain import GENESIS, Chain
from effectlog.fold import Record, Row, RunState, fold_rows, replay, replay_records, replay_records_fast
from effectlog.integrity import verify_run
from effectlog.journal import SqliteJournal, checkpoint, load_run, stored_rows
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import Runtime
from strategies import legal_histories
from test_fold_fast import outcome, read_back_records_of, records_of

pytest_plugins = ["pg_fixture"]


def row_of(rec: Record) -> Row:
    return rec.seq, rec.body, rec.hash, rec.step_id, rec.phase, rec.attempt


def drain(
    rows: list[Row], chain: Chain, run_id: str, stops: list[int]
) -> tuple[list[tuple[RunState, set[str]]], RunState]:
    """Every (state, changed steps) ``fold_rows`` yields at ``stops``, and its final state."""
    folding, seen = fold_rows(rows, chain, run_id=run_id, stops=stops), []
    while True:
        try:
            seen.append(next(folding))
        except StopIteration as done:
            return seen, done.value


@given(history=legal_histories(max_events=60), keyed=st.booleans(), data=st.data())
def test_each_stop_yields_the_pure_folds_state_there_and_the_steps_changed_since(
    history: list[ev.Event], keyed: bool, data: st.DataObject
) -> None:
    """At each reachable stop (seq 0 included) the state is the pure fold's of the rows up to it and the
    ids are the steps the rows since the previous stop changed; stops past the end are not yielded;
    the final state is the pure fold's of all."""
    chain = Chain(b"k" if keyed else None)
    records = read_back_records_of(history, chain)
    run_id, last = history[0].run_id, len(records)
    stops = sorted(data.draw(st.sets(st.integers(0, last + 3), max_size=8), label="stops"))
    seen, final = drain([row_of(r) for r in records], chain, run_id, stops)
    expected = []
    previous = 0
    for stop in (s for s in stops if s <= last):
        steps = {e.step_key for e in history[previous:stop] if e.step_key}
        expected.append((replay_records(records[:stop], chain, run_id=run_id), steps))
        previous = stop
    assert expected == seen
    assert replay_records(records, chain, run_id=run_id) == final


@given(history=legal_histories(max_events=40), keyed=st.booleans())
def test_a_stop_at_every_seq_sees_each_step_between_its_events_as_the_pure_fold_has_it(
    history: list[ev.Event], keyed: bool
) -> None:
    """A stop after every row: each step is seen between any two of its events (after its request, after
    its receipt, before its confirmation), where the replay-only fold has not built it yet on its short
    path; each state is the pure fold's of the rows up to there, with the one step that row changed."""
    chain = Chain(b"k" if keyed else None)
    records = read_back_records_of(history, chain)
    run_id, last = history[0].run_id, len(records)
    seen, final = drain([row_of(r) for r in records], chain, run_id, list(range(last + 1)))
    expected = [(replay_records(records[:0], chain, run_id=run_id), set[str]())]
    expected += [
        (replay_records(records[:n], chain, run_id=run_id), {history[n - 1].step_key} - {""})
        for n in range(1, last + 1)
    ]
    assert expected == seen
    assert replay_records(records, chain, run_id=run_id) == final


# A body rewritten and the chain recomputed from it on (what a rewrite without a key can do: only the
# decode, the columns and the fold are left to catch it): the body twice (two JSON documents), cut
# short, or a byte flipped.
REHASHED = ["two_documents", "truncated", "body_rehashed"]
TAMPERS = ["body", "hash", "seq", "step_id", "phase", "attempt", "drop", "duplicate", "swap", *REHASHED]


def rehashed(records: list[Record], i: int, body: bytes, chain: Chain) -> list[Record]:
    """``records`` with row ``i``'s body replaced by ``body`` and every hash from row ``i`` on recomputed."""
    out = list(records[:i])
    head = out[-1].hash if out else GENESIS
    for rec in records[i:]:
        stored = body if len(out) == i else rec.body
        head = chain.link(head, stored)
        out.append(msgspec.structs.replace(rec, body=stored, hash=head))
    return out


def tampered(records: list[Record], kind: str, data: st.DataObject, chain: Chain) -> list[Record]:
    """``records`` with one tamper of ``kind`` (what a damaged or edited journal reads back as)."""
    out = list(records)
    i = data.draw(st.integers(0, len(out) - 1), label="row")
    rec = out[i]
    if kind == "two_documents":
        between = data.draw(st.sampled_from([b"", b" ", b",", b"\n"]), label="between")
        out = rehashed(records, i, rec.body + between + rec.body, chain)
    elif kind == "truncated":
        out = rehashed(records, i, rec.body[: data.draw(st.integers(0, len(rec.body) - 1), label="cut")], chain)
    elif kind == "body_rehashed":
        body = bytearray(rec.body)
        body[data.draw(st.integers(0, len(body) - 1), label="byte")] ^= data.draw(st.integers(1, 255), label="mask")
        out = rehashed(records, i, bytes(body), chain)
    elif kind in ("body", "hash"):
        stored = bytearray(getattr(rec, kind))
        stored[data.draw(st.integers(0, len(stored) - 1), label="byte")] ^= data.draw(st.integers(1, 255), label="mask")
        out[i] = msgspec.structs.replace(rec, **{kind: bytes(stored)})
    elif kind == "seq":
        out[i] = msgspec.structs.replace(rec, seq=rec.seq + data.draw(st.sampled_from([-1, 1, 7]), label="by"))
    elif kind == "attempt":
        out[i] = msgspec.structs.replace(rec, attempt=(rec.attempt or 0) + 1)
    elif kind in ("step_id", "phase"):
        value = data.draw(st.sampled_from(["", "x", "step.confirmed", "step.requested"]), label="value")
        out[i] = msgspec.structs.replace(rec, **{kind: value if value != getattr(rec, kind) else "y"})
    elif kind == "drop":
        del out[i]
    elif kind == "duplicate":
        out.insert(i, rec)
    else:
        j = data.draw(st.integers(0, len(out) - 1), label="other")
        out[i], out[j] = out[j], out[i]
    return out


@settings(max_examples=300)
@given(history=legal_histories(max_events=40), keyed=st.booleans(), kind=st.sampled_from(TAMPERS), data=st.data())
def test_every_tamper_is_refused_as_the_pure_fold_refuses_it(
    history: list[ev.Event], keyed: bool, kind: str, data: st.DataObject
) -> None:
    """One tampered row (a flipped byte of a body or a hash; a changed seq, step_id, phase or attempt
    column; a row dropped, duplicated or two swapped): the one-pass fold over rows, with stops or
    without, and the replay-only fold over records end exactly as the pure fold does: the same error
    type, message, run, seq, step and column (or, where the tamper changes nothing the fold reads, such
    as a swap of a row with itself, the same state)."""
    chain = Chain(b"k" if keyed else None)
    records = tampered(read_back_records_of(history, chain), kind, data, chain)
    run_id = history[0].run_id
    expected = outcome(replay_records, records, chain, run_id=run_id)
    stops = sorted(data.draw(st.sets(st.integers(0, len(records) + 1), max_size=5), label="stops"))

    def through_rows() -> RunState:
        return drain([row_of(r) for r in records], chain, run_id, stops)[1]

    assert expected == outcome(through_rows)
    assert expected == outcome(replay_records_fast, records, chain, run_id=run_id)


@settings(max_examples=200)
@given(
    history=legal_histories(max_events=40),
    keyed=st.booleans(),
    kind=st.sampled_from(["two_documents", "truncated"]),
    data=st.data(),
)
def test_a_body_that_is_not_one_json_document_is_refused_at_its_row_even_rehashed(
    history: list[ev.Event], keyed: bool, kind: str, data: st.DataObject
) -> None:
    """A body that is two JSON documents (with or without a separator between them) or one cut short,
    its hash and every later one recomputed, passes the chain check and is refused by the decode: the
    pure fold, the one-pass fold over rows and the replay-only fold all end with the same
    ``corrupt_event`` at that row's seq."""
    chain = Chain(b"k" if keyed else None)
    original = read_back_records_of(history, chain)
    records = tampered(original, kind, data, chain)
    row = next(i for i, (a, b) in enumerate(zip(original, records, strict=True)) if a.body != b.body)
    run_id = history[0].run_id
    expected = outcome(replay_records, records, chain, run_id=run_id)
    assert isinstance(expected, tuple)
    assert ("CorruptEvent", records[row].seq) == (expected[0], expected[2][1])
    assert expected[1].startswith("event does not decode")
    assert expected == outcome(lambda: drain([row_of(r) for r in records], chain, run_id, [])[1])
    assert expected == outcome(replay_records_fast, records, chain, run_id=run_id)


@given(history=legal_histories(max_events=30), data=st.data())
def test_a_record_of_another_run_is_refused_as_the_pure_fold_refuses_it(
    history: list[ev.Event], data: st.DataObject
) -> None:
    """A record whose run_id column names another run (no journal's ``read`` gives one, a custom
    journal's might): the replay-only fold hands it and the rest to the pure fold, same error."""
    chain = Chain()
    records = records_of(history, chain)
    i = data.draw(st.integers(0, len(records) - 1), label="row")
    records[i] = msgspec.structs.replace(records[i], run_id="another-run")
    run_id = history[0].run_id
    expected = outcome(replay_records, records, chain, run_id=run_id)
    assert isinstance(expected, tuple)
    assert expected == outcome(replay_records_fast, records, chain, run_id=run_id)


def noop_plan(run_id: str, steps: int) -> Plan:
    return Plan(
        run_id=run_id,
        adapters={"noop": AdapterDecl(type="noop", idempotent=True)},
        steps=tuple(StepDecl(id=f"step-{i}", adapter="noop") for i in range(steps)),
    )


def test_verify_and_load_run_over_sqlite_rows_equal_the_pure_fold_of_its_records(tmp_path: Path) -> None:
    """On a real SQLite journal with checkpoint segments (read as rows, no records), ``verify_run`` and
    ``load_run`` give the state the pure fold gives over ``read``'s records."""
    path = tmp_path / "j.db"
    with Runtime(SqliteJournal(path, durability="normal")) as rt:
        rt.run(noop_plan("rows", 400))
    with SqliteJournal(path, writer=False) as journal:
        assert stored_rows(journal, "rows") is not None
        assert len(journal.stored_checkpoints("rows")) > 1
        expected = replay_records(list(journal.read("rows")), journal.chain, run_id="rows")
        assert expected == verify_run(journal, "rows")
        assert expected == load_run(journal, "rows")


@pytest.mark.postgres
def test_verify_and_load_run_over_postgres_rows_equal_the_pure_fold_of_its_records(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same on PostgreSQL (its ``read_rows``), a segment every 16 events."""
    from effectlog.journal import checkpoint
    from effectlog.journal.postgres import PostgresJournal

    monkeypatch.setattr(checkpoint, "EVERY_EVENTS", 16)

    with Runtime(PostgresJournal(pg_url)) as rt:
        rt.run(noop_plan("rows", 40))
    with PostgresJournal(pg_url, writer=False) as journal:
        assert stored_rows(journal, "rows") is not None
        assert len(journal.stored_checkpoints("rows")) > 1
        expected = replay_records(list(journal.read("rows")), journal.chain, run_id="rows")
        assert expected == verify_run(journal, "rows")
        assert expected == load_run(journal, "rows")


@settings(max_examples=60, deadline=None)
@given(history=legal_histories(max_events=40), data=st.data())
def test_verify_over_a_real_journal_of_every_event_kind_with_segments_equals_the_pure_fold(
    history: list[ev.Event], data: st.DataObject
) -> None:
    """A random legal history (every event type: resends, uncertain and reconciled steps, denials and
    approvals, sleeps, expiries, carried steps, closings) appended to a real SQLite file in random
    batches, each open batch with the checkpoint segment a writer gives it (the pure fold's state there
    and the steps the batch changed): ``verify_run`` (the one pass over the rows, paused at every
    segment and compared with it) and ``load_run`` give the pure fold's state over ``read``'s records."""
    run_id = history[0].run_id
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(history) - 1)), max_size=6), label="cuts"))
    cuts = [c for c in cuts if c < len(history)]
    with tempfile.TemporaryDirectory() as tmp, SqliteJournal(Path(tmp) / "j.db", durability="normal") as journal:
        start, state = 0, None
        for end in [*cuts, len(history)]:
            batch = history[start:end]
            state = replay(batch, state)
            segments = []
            if not state.closed:
                changed = {e.step_key for e in batch if e.step_key}
                segments = [checkpoint.segment_row(state, sorted(changed))]
            journal.append_checkpointed(batch, (), segments)
            start = end
        expected = replay_records(list(journal.read(run_id)), journal.chain, run_id=run_id)
        assert expected == verify_run(journal, run_id)
        assert expected == load_run(journal, run_id)
