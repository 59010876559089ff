"""Open-run checkpoints: a resume loads the segments bound to the chain plus the events after
them, into the state a full replay gives; a segment that is not bound is never used, and
``verify`` checks every column of every segment against the replay."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

import journal_tamper
from effectlog.adapters import EffectStore
from effectlog.chain import GENESIS, Chain
from effectlog.crashmatrix.processes import run_process
from effectlog.errors import ChainBroken, CorruptEvent, IntegrityError
from effectlog.fold import RunState
from effectlog.integrity import verify_run
from effectlog.journal import SqliteJournal, checkpoint, load_for_resume, load_run, resume_point
from effectlog.journal.frontier import Frontier
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import Runtime, SimulatedCrash

pytest_plugins = ["pg_fixture"]


def plan_of(run_id: str, steps: int, adapter: str = "noop") -> Plan:
    idempotent = adapter != "effects.control"
    return Plan(
        run_id=run_id,
        adapters={"tool": AdapterDecl(type=adapter, idempotent=idempotent)},
        steps=tuple(StepDecl(id=f"s{i}", adapter="tool", args={"i": i}) for i in range(steps)),
    )


def crash_after(step_id: str, point: str = "after_confirm"):  # type: ignore[no-untyped-def]
    def hook(where: str, sid: str) -> None:
        if where == point and sid == step_id:
            raise SimulatedCrash(where)

    return hook


@pytest.fixture
def every_4(monkeypatch: pytest.MonkeyPatch) -> None:
    """A segment with every batch that brings a run 4 events past its last one."""
    monkeypatch.setattr(checkpoint, "EVERY_EVENTS", 4)


def half_run(path: Path, steps: int = 10, stop_at: str = "s5", point: str = "after_confirm") -> Plan:
    plan = plan_of("r", steps)
    with Runtime(path, crash_hook=crash_after(stop_at, point)) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    return plan


def segments(path: Path) -> list[tuple[int, bytes, bytes, bytes]]:
    with sqlite3.connect(path) as db:
        return [(r[0], r[1], r[2], r[3]) for r in db.execute("SELECT seq, prev, body, hash FROM checkpoints")]


@pytest.mark.usefixtures("every_4")
@pytest.mark.parametrize("point", ["after_request", "after_effect", "after_confirm"])
def test_resume_from_segments_equals_the_full_replay(tmp_path: Path, point: str) -> None:
    """A run stopped anywhere resumes from its segments plus the tail into the IDENTICAL state
    (every step's fields, receipts and the plan included) a full replay gives."""
    plan = half_run(tmp_path / "j.db", point=point)
    assert len(segments(tmp_path / "j.db")) >= 3
    with SqliteJournal(tmp_path / "j.db") as journal:
        state, segment_seq, touched = load_for_resume(journal, "r", plan)
        full = load_run(journal, "r")
    assert full == state
    assert 0 < segment_seq <= full.seq
    assert {s.step_id for s in full.steps.values() if s.last_seq > segment_seq} == touched


@pytest.mark.usefixtures("every_4")
def test_resume_reads_only_the_events_after_the_last_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The resume does not replay the history: with the full replay made to fail, the run still
    resumes, finishes, and its journal then verifies and equals what a full replay gives."""
    plan = half_run(tmp_path / "j.db")

    def no_full_replay(*args: object, **kwargs: object) -> None:
        raise AssertionError("the open run was replayed in full")

    monkeypatch.setattr("effectlog.journal.load_run", no_full_replay)
    with Runtime(tmp_path / "j.db") as rt:
        outcome = rt.run(plan)
    monkeypatch.undo()
    assert ("completed", 10 * 3 + 3) == (outcome.state, len(list(SqliteJournal(tmp_path / "j.db").read("r"))))
    with SqliteJournal(tmp_path / "j.db", writer=False) as journal:
        assert load_run(journal, "r") == verify_run(journal, "r")


@pytest.mark.usefixtures("every_4")
def test_a_segment_is_written_in_the_transaction_of_its_batch(tmp_path: Path) -> None:
    """A crash inside the commit that carries a segment (before COMMIT) leaves neither the batch nor
    the segment: every stored segment names an event the journal has."""
    plan = plan_of("r", 6)
    hook = crash_after("s3", "before_commit:step.effected")
    with Runtime(tmp_path / "j.db", crash_hook=hook) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    with SqliteJournal(tmp_path / "j.db") as journal:
        head = journal.head("r")[0]
        stored = journal.stored_checkpoints("r")
    assert stored
    assert all(seq <= head for _, seq, _, _, _ in stored)


@pytest.mark.usefixtures("every_4")
@pytest.mark.parametrize("which", ["middle", "last"])
@pytest.mark.parametrize("damage", ["body", "hash", "delete", "event edited"])
def test_a_segment_not_bound_to_the_chain_is_never_used_and_verify_names_it(
    tmp_path: Path, damage: str, which: str
) -> None:
    """An edited segment body or hash, a removed segment or an edited event under it.

    The last segment damaged: the resume ignores the segments and replays in full (which stops on a
    broken event chain). A segment before the last damaged: the resume uses only the last one (bound
    to its event; full verification stays in ``verify``, as for seals), and when the done steps are
    loaded the damaged segment is not used either (full replay: the right states, or ``ChainBroken``
    for an edited event). ``verify`` raises an integrity error naming the checkpoints column (or the event)."""
    path = tmp_path / "j.db"
    plan = half_run(path)
    rows = segments(path)
    at = 1 if which == "middle" else len(rows) - 1
    with journal_tamper.connect(path) as db:
        db.execute("DROP TRIGGER checkpoints_append_only_update")
        db.execute("DROP TRIGGER checkpoints_append_only_delete")
        db.execute("DROP TRIGGER events_append_only_update")
        seq = rows[at][0]
        if damage == "body":
            db.execute("UPDATE checkpoints SET body = ? WHERE seq = ?", (rows[at][2][:-1] + b"\x00", seq))
        elif damage == "hash":
            db.execute("UPDATE checkpoints SET hash = ? WHERE seq = ?", (bytes(32), seq))
        elif damage == "delete":
            db.execute("DELETE FROM checkpoints WHERE seq = ?", (seq,))
        else:
            db.execute("UPDATE ev SET hash = ? WHERE seq = ?", (bytes(32), seq))
    with SqliteJournal(path) as journal:
        if damage == "event edited":
            with pytest.raises(ChainBroken):
                load_for_resume(journal, "r", plan)  # (which loads every step)
        else:
            point = resume_point(journal, "r", plan)
            state, segment_seq, _ = load_for_resume(journal, "r", plan)
            used = {
                ("middle", "delete"): rows[-1][0],
                ("last", "delete"): rows[-2][0],
                ("middle", "body"): rows[-1][0],
                ("middle", "hash"): rows[-1][0],
            }.get((which, damage), 0)
            assert (load_run(journal, "r"), used, used) == (state, segment_seq, point.segment_seq)
        if (which, damage) == ("last", "delete"):
            assert load_run(journal, "r") == verify_run(journal, "r")  # a shorter chain of segments, as written
            return
        with pytest.raises(IntegrityError) as info:
            verify_run(journal, "r")
    if damage == "event edited":
        return  # the event's own column
    column = {"body": "checkpoints.hash", "hash": "checkpoints.hash", "delete": "checkpoints.prev"}[damage]
    named = rows[at + 1][0] if damage == "delete" else seq
    assert (column, named) == (info.value.fields["column"], info.value.seq)


@pytest.mark.usefixtures("every_4")
def test_verify_refuses_a_segment_that_links_but_disagrees_with_the_replay(tmp_path: Path) -> None:
    """A segment re-hashed after its body was changed (an unkeyed chain can be recomputed): it links,
    but verify compares it with the replay at its seq and names checkpoints.body."""
    path = tmp_path / "j.db"
    half_run(path)
    with SqliteJournal(path) as journal:
        stored = journal.stored_checkpoints("r")
        run_id, seq, prev, _, _ = stored[-1]
        state = load_run(journal, "r")
        records = {r.seq: r for r in journal.read("r")}
        lie = msgspec.structs.replace(state, seq=seq, resumes=state.resumes + 1)  # one field that is not so
        forged = checkpoint.segment_row(lie, [])[2]
        digest = checkpoint.link(journal.chain, records[seq].hash, prev, forged)
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER checkpoints_append_only_update")
        db.execute("UPDATE checkpoints SET body = ?, hash = ? WHERE seq = ?", (forged, digest, seq))
    with SqliteJournal(path) as journal, pytest.raises(CorruptEvent) as info:
        verify_run(journal, run_id)
    assert ("checkpoints.body", seq) == (info.value.fields["column"], info.value.seq)


@pytest.mark.usefixtures("every_4")
@pytest.mark.parametrize("sql", ["UPDATE checkpoints SET seq = seq + 1000", "DELETE FROM checkpoints"])
def test_the_database_rejects_update_and_delete_of_segments(tmp_path: Path, sql: str) -> None:
    """Segments are append-only, like events and seals."""
    half_run(tmp_path / "j.db")
    with sqlite3.connect(tmp_path / "j.db") as db, pytest.raises(sqlite3.IntegrityError, match="append-only"):
        db.execute(sql)


@pytest.mark.usefixtures("every_4")
def test_a_resume_under_another_plan_ignores_the_segments_and_is_refused(tmp_path: Path) -> None:
    """Segments were written for the run's pinned plan: another plan gets the full replay and the
    usual PlanMismatch, nothing is written."""
    path = tmp_path / "j.db"
    half_run(path)
    before = len(list(SqliteJournal(path).read("r")))
    with Runtime(path) as rt, pytest.raises(Exception, match="different plan"):
        rt.run(plan_of("r", 11))
    assert before == len(list(SqliteJournal(path).read("r")))


def test_a_journal_without_the_checkpoints_table_is_read_and_resumed(tmp_path: Path) -> None:
    """Older journals have no checkpoints table: a reader finds no segments, a writer adds it."""
    path = tmp_path / "j.db"
    plan = half_run(path)
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE checkpoints")
    with SqliteJournal(path, writer=False) as reader:
        assert [] == reader.stored_checkpoints("r")
        assert "running" == verify_run(reader, "r").state
    with Runtime(path) as rt:
        assert "completed" == rt.run(plan).state


@pytest.mark.parametrize("every", ["1", "2"])
@pytest.mark.parametrize("point", ["after_request", "after_effect", "after_confirm"])
def test_killed_runs_resumed_from_segments_apply_each_effect_once(tmp_path: Path, every: str, point: str) -> None:
    """Real SIGKILL of the crash matrix's worker (``effectlog run``) at a boundary, with a segment in
    every batch or every 2 events; then ``effectlog run`` resumes from the segments: every step's
    effect is applied exactly once and ``effectlog verify`` passes."""
    journal, effects, plan_file = tmp_path / "j.db", tmp_path / "effects.db", tmp_path / "plan.json"
    plan_file.write_bytes(msgspec.json.encode(plan_of("k", 4, adapter="effects.idempotent")))
    env = {**os.environ, "EFFECTLOG_CHECKPOINT_EVERY": every}
    worker = [sys.executable, "-m", "effectlog", "crash-matrix", "worker", "--plan", str(plan_file)]
    killed = run_process("crash", [*worker, "--journal", str(journal), "--effects", str(effects)], point, env=env)
    assert (point, 9) == (killed.reached, killed.signal)
    run = [sys.executable, "-m", "effectlog", "run", str(plan_file), "--journal", str(journal)]
    done = subprocess.run([*run, "--effects", str(effects), "--quiet"], env=env, capture_output=True, timeout=60)
    assert 0 == done.returncode, done.stderr
    store = EffectStore(str(effects))
    try:
        assert [1, 1, 1, 1] == [store.count(run_id="k", step_id=f"s{i}") for i in range(4)]
    finally:
        store.close()
    checked = subprocess.run(
        [sys.executable, "-m", "effectlog", "verify", "--journal", str(journal)], capture_output=True, timeout=60
    )
    assert 0 == checked.returncode, checked.stderr
    with SqliteJournal(journal, writer=False) as reader:
        assert reader.stored_checkpoints("k")


@pytest.mark.postgres
@pytest.mark.usefixtures("every_4")
def test_on_postgresql_a_run_resumes_from_its_segments_into_the_full_replay_state(pg_url: str) -> None:
    """The same mechanism on PostgreSQL: the runtime writes segments with its batches, a resume
    loads them plus the tail into the state a full replay gives, finishes, and verify passes."""
    from effectlog.journal.postgres import PostgresJournal

    plan = plan_of("pg", 10)
    with Runtime(PostgresJournal(pg_url), crash_hook=crash_after("s5")) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    with PostgresJournal(pg_url) as journal:
        assert len(journal.stored_checkpoints("pg")) >= 3
        state, segment_seq, _ = load_for_resume(journal, "pg", plan)
        assert (load_run(journal, "pg"), True) == (state, segment_seq > 0)
    with Runtime(PostgresJournal(pg_url)) as rt:
        assert "completed" == rt.run(plan).state
    with PostgresJournal(pg_url, writer=False) as journal:
        assert load_run(journal, "pg") == verify_run(journal, "pg")


@pytest.mark.usefixtures("every_4")
def test_an_open_run_whose_tail_was_cut_under_a_segment_is_refused(tmp_path: Path) -> None:
    """Events cut from the end of an open run, past its last segment's event: the segment is evidence
    (it was written in that event's transaction), so ``run`` refuses with ``truncated`` (exit 7, one
    line, nothing written, no step sent again) and ``verify`` says the same."""
    from effectlog.errors import ExitStatus, Truncated

    path = tmp_path / "j.db"
    plan = half_run(path)
    last = segments(path)[-1][0]
    with journal_tamper.connect(path) as db:
        db.execute("DROP TRIGGER events_append_only_delete")
        db.execute("DELETE FROM ev WHERE seq >= ?", (last - 1,))
        kept = db.execute("SELECT count(*) FROM ev").fetchone()[0]
    (tmp_path / "plan.json").write_bytes(msgspec.json.encode(plan))
    done = subprocess.run(
        [sys.executable, "-m", "effectlog", "run", str(tmp_path / "plan.json"), "--journal", str(path), "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (int(ExitStatus.INTEGRITY), 1) == (done.returncode, len(done.stderr.strip().splitlines())), done.stderr
    assert "cut from the end" in done.stderr
    with SqliteJournal(path, writer=False) as journal:
        assert kept == len(list(journal.read("r")))
        with pytest.raises(Truncated):
            verify_run(journal, "r")


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", " 8", "٣"])
def test_a_malformed_cadence_setting_is_refused_before_anything_is_written(tmp_path: Path, value: str) -> None:
    """``EFFECTLOG_CHECKPOINT_EVERY`` that is not a whole number is one line and exit 2, and no
    journal is created (it used to be silently ignored)."""
    journal, plan_file = tmp_path / "j.db", tmp_path / "plan.json"
    plan_file.write_bytes(msgspec.json.encode(plan_of("bad", 2)))
    env = {**os.environ, "EFFECTLOG_CHECKPOINT_EVERY": value}
    done = subprocess.run(
        [sys.executable, "-m", "effectlog", "run", str(plan_file), "--journal", str(journal), "--quiet"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert (2, 1) == (done.returncode, len(lines)), done.stderr
    assert "EFFECTLOG_CHECKPOINT_EVERY" in lines[0]
    assert "whole number" in lines[0]
    assert not journal.exists()


@pytest.mark.usefixtures("every_4")
def test_segments_are_stored_compressed_and_plain_ones_of_earlier_journals_still_resume_and_verify(
    tmp_path: Path,
) -> None:
    """New segment bodies are zlib over msgpack (a resume inflates only the last one); a journal whose
    segments an earlier version wrote as plain msgpack, each hash-bound over those plain bytes,
    still resumes lazily from them into the full replay's state, verifies, and finishes its run."""
    import zlib

    path = tmp_path / "j.db"
    plan = half_run(path)
    stored = segments(path)
    assert len(stored) >= 3
    assert all(body[:1] == b"\x78" for _, _, body, _ in stored)
    # The same journal as an earlier version wrote it: each body plain, each hash re-bound to it.
    with journal_tamper.connect(path) as db:
        db.execute("DROP TRIGGER checkpoints_append_only_delete")
        db.execute("DELETE FROM checkpoints")
        prev, chain = GENESIS, Chain()
        for seq, _, body, _ in stored:
            (event_hash,) = db.execute("SELECT hash FROM ev WHERE run_id = 'r' AND seq = ?", (seq,)).fetchone()
            plain = zlib.decompress(body)
            digest = checkpoint.link(chain, event_hash, prev, plain)
            db.execute("INSERT INTO checkpoints VALUES ('r', ?, ?, ?, ?)", (seq, prev, plain, digest))
            prev = digest
        db.execute(checkpoint.SQLITE_DDL[2])
    assert all(body[:1] != b"\x78" for _, _, body, _ in segments(path))
    with SqliteJournal(path) as journal:
        point = resume_point(journal, "r", plan)
        full = load_run(journal, "r")
        assert point.segment_seq == stored[-1][0]  # resumed from the last (plain) segment, not replayed
        assert full == verify_run(journal, "r")
        assert [full.steps[s] for s in sorted(full.steps)] == [point.state.steps[s] for s in sorted(full.steps)]
    with Runtime(path) as rt:
        assert "completed" == rt.run(plan).state
    with SqliteJournal(path, writer=False) as journal:
        assert "completed" == verify_run(journal, "r").state


def _segment_row_as_before(state: RunState, changed: list[str], frontier: Frontier | None) -> bytes:
    """``segment_row``'s body as it was built before it decoded its JSON into the slim twins: through
    ``Segment`` (each step a ``StepState``), then each step rebuilt as a ``_SlimStep``."""
    import zlib

    segment = checkpoint.Segment(
        **{f: getattr(state, f) for f in checkpoint.Segment.__struct_fields__ if f not in ("steps", "frontier")},
        steps=sorted((state.steps[s] for s in changed if s in state.steps), key=lambda s: s.index),
        frontier=frontier,
    )
    segment = msgspec.json.decode(msgspec.json.encode(segment), type=checkpoint.Segment)
    slim = checkpoint._SlimStep
    segment = msgspec.structs.replace(segment, steps=[slim(*msgspec.structs.astuple(s)) for s in segment.steps])
    if segment.frontier is not None:
        opened = [slim(*msgspec.structs.astuple(s)) for s in segment.frontier.open]
        segment = msgspec.structs.replace(segment, frontier=msgspec.structs.replace(segment.frontier, open=opened))
    return zlib.compress(msgspec.msgpack.encode(segment), 1)


def test_a_segment_body_is_byte_for_byte_what_it_was_before_the_slim_decode() -> None:
    """``segment_row`` builds slim twins of ``Segment``, ``Frontier`` and ``StepState`` directly, with only
    the fields typed ``Any`` taken through JSON (issue 18, hot path; before that it decoded the whole
    segment's JSON into them, and before that built each step as a ``StepState`` first): the stored
    bytes are unchanged, for steps with bytes and nested receipts, args, approvals,
    failures, open steps in the frontier and run-level fields set, and for no frontier at all."""
    from effectlog import events as ev
    from effectlog.fold import replay

    ids = [f"s{i}" for i in range(5)]
    plan = {"steps": [{"id": s} for s in ids]}
    adapters = {"t": ev.AdapterIdentity(type="t", version="1", idempotent=True)}
    events: list[ev.Event] = [ev.RunStarted(run_id="r", seq=1, ts=1, plan=plan, plan_digest="d", adapters=adapters)]

    def add(cls: type[ev.Event], **fields: object) -> None:
        events.append(cls(run_id="r", seq=len(events) + 1, ts=len(events) * 10, **fields))

    receipts = [b"\x00\xffraw", {"nested": [1, 2.5, None, {"b": b"x"}], "text": "é"}, None]
    for i, receipt in enumerate(receipts):
        add(ev.StepRequested, step_id=ids[i], adapter="t", idempotency_key=f"k{i}", args_digest="a", idempotent=True)
        add(ev.StepEffected, step_id=ids[i], receipt=receipt, ok=i != 2)
        if i != 2:
            add(ev.StepConfirmed, step_id=ids[i])
    add(ev.StepDenied, step_id=ids[3], decision="require_approval", by="policy", reason="held", args_digest="a")
    add(ev.StepApproved, step_id=ids[3], by="alice", args_digest="a", expires_at=99)
    add(ev.StepFailed, step_id=ids[2], reason="no", applied=None)
    add(ev.RunFailed, step_id=ids[2], reason="no")
    state = replay(events)
    frontier = Frontier(prefix=2, count=4, done_after=[], open=[state.steps[ids[2]], state.steps[ids[3]]])
    for changed, front in ((ids, frontier), (ids[1:3], None), ([], frontier)):
        expected = _segment_row_as_before(state, changed, front)
        assert expected == checkpoint.segment_row(state, changed, front)[2]


def test_a_segment_body_is_the_whole_segments_json_round_trip_for_values_json_changes() -> None:
    """``segment_row`` takes only the fields that hold arbitrary values (a step's ``args`` and
    ``receipt``, the run's ``result``) through JSON, not the whole segment (issue 18): the bytes are those of the whole
    segment's round trip for every kind of value JSON gives back otherwise (bytes, tuples, sets,
    NaN, a struct, a datetime), and decode to what the replay of the stored journal gives."""
    import datetime

    from effectlog import events as ev
    from effectlog.fold import replay

    class Inner(msgspec.Struct):
        a: int
        b: bytes

    odd: list[Any] = [
        (1, (2, b"\x01")),
        {"k": {2.5, 3}, "a": "one"},
        float("nan"),
        Inner(a=1, b=b"\xfe"),
        datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        [],
        {},
        "",
        0,
    ]
    ids = [f"s{i}" for i in range(len(odd))]
    events: list[ev.Event] = [ev.RunStarted(run_id="r", seq=1, ts=1, plan={"steps": []}, kind="session")]

    def add(cls: type[ev.Event], **fields: object) -> None:
        events.append(cls(run_id="r", seq=len(events) + 1, ts=len(events) * 10, **fields))

    for i, value in enumerate(odd):
        args = {"v": value, "t": (i,)}
        add(ev.StepRequested, step_id=ids[i], adapter="t", idempotency_key=f"k{i}", args_digest="a", args=args)
        add(ev.StepEffected, step_id=ids[i], receipt=value, ok=True)
    state = msgspec.structs.replace(replay(events), result={"r": (b"\x00", float("inf"))})
    # The journal's own way: the events as stored (JSON), decoded and folded.
    stored = [ev.decode(ev.encode(e)) for e in events]
    replayed = msgspec.structs.replace(replay(stored), result={"r": ["AA==", None]})
    frontier = Frontier(prefix=0, count=len(ids), done_after=[], open=[state.steps[s] for s in ids[:3]])
    for changed, front in ((ids, frontier), (ids[2:5], None), ([], frontier)):
        body = checkpoint.segment_row(state, changed, front)[2]
        assert _segment_row_as_before(state, changed, front) == body
        decoded = checkpoint._decode(body)
        assert decoded.steps == [replayed.steps[s] for s in changed]
        assert decoded.result == replayed.result
        if front is not None:
            assert decoded.frontier is not None
            assert decoded.frontier.open == [replayed.steps[s] for s in ids[:3]]


@pytest.mark.parametrize("carried", ["both", "s1 only, s0 unchanged since", "s1 only, s0 changed since"])
def test_a_step_changed_since_the_last_segment_but_left_out_of_this_one_is_compared_with_its_last_segment(
    carried: str,
) -> None:
    """``check_segments`` keeps, per step a segment carried, the replay's step there (the segment's own
    was compared equal to it and is freed): a step changed since the previous segment that this one
    leaves out must still be as its last segment had it, else ``checkpoints.body``; left out while it
    did not change, it is accepted."""
    from effectlog.fold import replay
    from effectlog.testing import sample_run

    events = sample_run("r", steps=2)  # 1 started, 2-4 s0, 5-7 s1, 8 completed
    chain = Chain()
    changed_since = carried == "s1 only, s0 changed since"
    first_at = 2 if changed_since else 4  # the first segment: s0 requested only, or s0 done
    states = {seq: replay(events[:seq]) for seq in (first_at, 7)}
    heads = {seq: chain_head(chain, events[:seq]) for seq in states}
    first = checkpoint.segment_row(states[first_at], ["s0"])[2]
    second = checkpoint.segment_row(states[7], ["s0", "s1"] if carried == "both" else ["s1"])[2]
    first_hash = checkpoint.link(chain, heads[first_at], GENESIS, first)
    stored = [
        ("r", first_at, GENESIS, first, first_hash),
        ("r", 7, first_hash, second, checkpoint.link(chain, heads[7], first_hash, second)),
    ]
    touched = {first_at: {"s0"}, 7: {"s0", "s1"} if changed_since else {"s1"}}

    def advance(seq: int) -> tuple[RunState, set[str]]:
        return msgspec.structs.replace(states[seq], head=heads[seq]), touched[seq]

    if changed_since:
        with pytest.raises(CorruptEvent) as info:
            checkpoint.check_segments(stored, advance, chain)
        assert ("checkpoints.body", 7) == (info.value.fields["column"], info.value.seq)
    else:
        checkpoint.check_segments(stored, advance, chain)


def chain_head(chain: Chain, events: list[Any]) -> bytes:
    """The chain's head after ``events`` encoded as a journal stores them."""
    from effectlog.events import encode

    head = GENESIS
    for event in events:
        head = chain.link(head, encode(event))
    return head


@pytest.mark.usefixtures("every_4")
def test_verify_compares_a_real_runs_segment_steps_as_stored_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The segments a run actor writes carry exactly the steps the replay changed since the previous one,
    encoded as ``segment_row`` encodes the replay's own steps: ``check_segments`` compares them byte for
    byte (``_quick``) instead of decoding each step, for every segment of the run."""
    path = tmp_path / "j.db"
    half_run(path)
    seen: list[bool] = []
    quick = checkpoint._quick

    def spy(body: bytes, state: RunState, touched: set[str]) -> Any:
        found = quick(body, state, touched)
        seen.append(found is not None)
        return found

    monkeypatch.setattr(checkpoint, "_quick", spy)
    with SqliteJournal(path, writer=False) as journal:
        assert load_run(journal, "r") == verify_run(journal, "r")
        assert len(seen) == len(journal.stored_checkpoints("r")) >= 3
    assert all(seen)


@pytest.mark.parametrize(
    "forgery",
    [
        "genuine",
        "the same steps in another encoding",
        "a changed step left out",
        "no step at all",
        "a step the replay does not have added",
        "a step's receipt altered",
        "a step's last_seq altered",
        "steps in another order",
        "a run-level field altered",
        "the frontier altered",
    ],
)
def test_a_segment_is_accepted_only_when_it_holds_the_replays_changed_steps_and_fields(forgery: str) -> None:
    """``check_segments`` against the replay of a real history at a segment after s0 and s1 both changed:
    the segment as ``segment_row`` writes it passes (by its stored bytes), the same values encoded another
    way or in another order pass (decoded and compared step by step, as before the byte comparison), and
    every forgery, re-hashed so that it links, is
    ``checkpoints.body``: whether its steps are byte for byte right and something else is not, or not."""
    import zlib

    from effectlog.fold import replay
    from effectlog.testing import sample_run

    events = sample_run("r", steps=3)  # 1 started, 2-4 s0, 5-7 s1, 8-10 s2, 11 completed
    chain = Chain()
    first_at, at = 2, 7  # the first segment: s0 requested only; the second: s0 done, s1 done
    states = {seq: replay(events[:seq]) for seq in (first_at, at)}
    heads = {seq: chain_head(chain, events[:seq]) for seq in states}
    state = states[at]
    first = checkpoint.segment_row(states[first_at], ["s0"])[2]
    first_hash = checkpoint.link(chain, heads[first_at], GENESIS, first)
    ids, frontier = ["s0", "s1"], Frontier(prefix=2, count=2, done_after=[], open=[])
    lie, changed, front = state, ids, frontier
    if forgery == "a changed step left out":
        changed = ["s1"]
    elif forgery == "no step at all":
        changed = []
    elif forgery == "a step the replay does not have added":
        extra = msgspec.structs.replace(state.steps["s1"], step_id="s9", index=9)
        lie, changed = msgspec.structs.replace(state, steps=state.steps.set("s9", extra)), [*ids, "s9"]
    elif forgery in ("a step's receipt altered", "a step's last_seq altered"):
        step = state.steps["s1"]
        step = (
            msgspec.structs.replace(step, receipt={"forged": 1})
            if "receipt" in forgery
            else msgspec.structs.replace(step, last_seq=step.last_seq - 1)
        )
        lie = msgspec.structs.replace(state, steps=state.steps.set("s1", step))
    elif forgery == "a run-level field altered":
        lie = msgspec.structs.replace(state, resumes=state.resumes + 1)
    elif forgery == "the frontier altered":
        front = Frontier(prefix=2, count=3, done_after=[], open=[])  # a step the replay does not have
    body = checkpoint.segment_row(lie, changed, front)[2]
    if forgery == "steps in another order":
        segment = checkpoint._decode(body)
        slim = [checkpoint._SlimStep(*msgspec.structs.astuple(s)) for s in reversed(segment.steps)]
        body = zlib.compress(msgspec.msgpack.encode(msgspec.structs.replace(segment, steps=slim)), 1)
    elif forgery == "the same steps in another encoding":  # each step in full (a ``StepState``), not slim
        body = zlib.compress(msgspec.msgpack.encode(checkpoint._decode(body)), 1)
    stored = [
        ("r", first_at, GENESIS, first, first_hash),
        ("r", at, first_hash, body, checkpoint.link(chain, heads[at], first_hash, body)),
    ]
    touched = {first_at: {"s0"}, at: {"s0", "s1"}}

    def advance(seq: int) -> tuple[RunState, set[str]]:
        return msgspec.structs.replace(states[seq], head=heads[seq]), touched[seq]

    if forgery in ("genuine", "the same steps in another encoding", "steps in another order"):
        checkpoint.check_segments(stored, advance, chain)
        assert (checkpoint._quick(body, advance(at)[0], touched[at]) is not None) == (forgery == "genuine")
        return
    with pytest.raises(CorruptEvent) as info:
        checkpoint.check_segments(stored, advance, chain)
    assert ("checkpoints.body", at) == (info.value.fields["column"], info.value.seq)


def test_a_receipt_with_an_int_past_64_bits_is_recorded_once_and_the_run_resumes_and_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool's answer holding an int msgpack cannot hold (an amount in wei: 10**21) is recordable (canonical
    JSON holds it), but a checkpoint segment carrying that step could not be encoded: the batch that records
    the receipt raised OverflowError after the tool had run, so the receipt was lost and every resume sent the
    step again and failed the same way. A segment is derived data: the run records the receipt, finishes,
    each step sent once, and the journal verifies and resumes into the full replay's state."""
    from effectlog.adapters.protocol import Receipt, Request

    monkeypatch.setattr(checkpoint, "EVERY_EVENTS", 1)  # a segment with every batch
    sent: list[str] = []

    class Ledger:
        def invoke(self, request: Request) -> Receipt:
            sent.append(request.step_id)
            return Receipt(data={"wei": 10**21 if request.step_id == "s1" else 1})

    plan = Plan(
        run_id="r",
        adapters={"tool": AdapterDecl(type="ledger", idempotent=True)},
        steps=tuple(StepDecl(id=f"s{i}", adapter="tool", args={"i": i}) for i in range(5)),
    )
    path = tmp_path / "j.db"
    adapters = {"ledger": lambda *_: Ledger()}
    with Runtime(path, adapters=adapters, crash_hook=crash_after("s3")) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    with SqliteJournal(path, writer=False) as journal:
        full = load_run(journal, "r")
        assert full.steps["s1"].receipt == {"wei": 10**21}
        assert (full, full) == (load_for_resume(journal, "r", plan)[0], verify_run(journal, "r"))
    with Runtime(path, adapters=adapters) as rt:
        assert rt.run(plan).state == "completed"
    assert sent == ["s0", "s1", "s2", "s3", "s4"]
    with SqliteJournal(path, writer=False) as journal:
        assert load_run(journal, "r") == verify_run(journal, "r")


@pytest.mark.parametrize(("honest", "forged"), [(1, True), (1, 1.0), (0.0, -0.0), ([1], [True])])
def test_verify_refuses_a_segment_whose_value_equals_the_replays_only_by_python_equality(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, honest: Any, forged: Any
) -> None:
    """A segment re-hashed after a receipt's ``1`` was rewritten ``true`` (or ``1.0``, or ``0.0`` as ``-0.0``):
    Python's ``==`` holds them equal, so ``verify`` passed it, and a resume from it held a receipt the events
    never recorded (``true`` where the tool answered ``1``). The segment's bytes differ from the replay's, so the
    step by step comparison decides: values must be of the same type (and a float of the same sign) as well."""
    from effectlog.adapters.protocol import Receipt, Request

    monkeypatch.setattr(checkpoint, "EVERY_EVENTS", 1)

    class Tool:
        def invoke(self, request: Request) -> Receipt:
            return Receipt(data={"n": honest})

    plan = Plan(
        run_id="r",
        adapters={"tool": AdapterDecl(type="tool", idempotent=True)},
        steps=tuple(StepDecl(id=f"s{i}", adapter="tool", args={"i": i}) for i in range(4)),
    )
    path = tmp_path / "j.db"
    adapters = {"tool": lambda *_: Tool()}
    with Runtime(path, adapters=adapters, crash_hook=crash_after("s2")) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    with SqliteJournal(path, writer=False) as journal:
        run_id, seq, prev, body, _ = journal.stored_checkpoints("r")[-1]
        event_hash = {r.seq: r.hash for r in journal.read("r")}[seq]
        chain = journal.chain
    segment = checkpoint._decode(body)
    assert [{"n": honest}] == [s.receipt for s in segment.steps]
    steps = [msgspec.structs.replace(s, receipt={"n": forged}) for s in segment.steps]
    lie = __import__("zlib").compress(msgspec.msgpack.encode(msgspec.structs.replace(segment, steps=steps)), 1)
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER checkpoints_append_only_update")
        db.execute(
            "UPDATE checkpoints SET body = ?, hash = ? WHERE seq = ?",
            (lie, checkpoint.link(chain, event_hash, prev, lie), seq),
        )
    with SqliteJournal(path, writer=False) as journal, pytest.raises(CorruptEvent) as info:
        verify_run(journal, run_id)
    assert ("checkpoints.body", seq) == (info.value.fields["column"], info.value.seq)


def test_a_frontiers_open_step_equal_to_the_replays_only_by_python_equality_is_refused() -> None:
    """The frontier's open steps are compared with the replay's as a segment's steps are: a receipt ``true``
    where the replay has ``1`` is a frontier that disagrees (``frontier.check``)."""
    import immutables

    from effectlog.fold import StepState
    from effectlog.journal import frontier as fr

    replayed = StepState(step_id="s0", index=0, state="requested", receipt={"n": 1})
    state = RunState(run_id="r", steps=immutables.Map({"s0": replayed}))
    honest = Frontier(prefix=0, count=1, open=[replayed])
    assert 0 == fr.check(honest, state, ["s0"], {"s0": 0}, 0)
    forged = Frontier(prefix=0, count=1, open=[msgspec.structs.replace(replayed, receipt={"n": True})])
    with pytest.raises(CorruptEvent):
        fr.check(forged, state, ["s0"], {"s0": 0}, 0)
