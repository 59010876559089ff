"""Test helpers shipped with effectlog, for our suites and for yours.

``JournalContract`` is the one contract every journal backend must pass. Subclass
it in a pytest module and provide a ``backend`` fixture returning a
``JournalBackend`` (how to open a fresh journal, and a raw SQL hook so the suite can
prove the *database* rejects updates and deletes)::

    class TestMyJournal(JournalContract):
        @pytest.fixture
        def backend(self, tmp_path): ...
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any, Protocol

import pytest

from effectlog import events as ev
from effectlog.chain import GENESIS
from effectlog.errors import EffectlogError, EventConflict, RunOwned, SequenceGap
from effectlog.fold import replay_records
from effectlog.journal.protocol import Journal


class JournalBackend(Protocol):
    def open(self) -> Journal:
        """A writer on a fresh, empty journal (the same one on every call)."""
        ...

    def raw_sql(self, sql: str) -> Any:
        """Execute SQL directly on the backend's database, bypassing effectlog."""
        ...


def sample_run(run_id: str = "run-1", steps: int = 2, ts: Callable[[], int] | None = None) -> list[ev.Event]:
    """A small legal history: started, then request/effect/confirm per step, then completed."""
    clock = ts or (lambda: 1_700_000_000_000_000_000)
    plan = {"run_id": run_id, "steps": [{"id": f"s{i}"} for i in range(steps)]}
    out: list[ev.Event] = [ev.RunStarted(run_id=run_id, seq=1, ts=clock(), plan=plan, plan_digest="d")]
    for i in range(steps):
        sid = f"s{i}"
        n = len(out)
        out += [
            ev.StepRequested(
                run_id=run_id,
                seq=n + 1,
                ts=clock(),
                step_id=sid,
                adapter="a",
                idempotency_key=f"k{i}",
                args_digest="x",
                idempotent=True,
            ),
            ev.StepEffected(run_id=run_id, seq=n + 2, ts=clock(), step_id=sid, receipt={"n": i}),
            ev.StepConfirmed(run_id=run_id, seq=n + 3, ts=clock(), step_id=sid),
        ]
    out.append(ev.RunCompleted(run_id=run_id, seq=len(out) + 1, ts=clock()))
    return out


class JournalContract:
    """Every journal backend must pass these; each test names the guarantee it checks."""

    @pytest.fixture
    def journal(self, backend: JournalBackend) -> Any:
        j = backend.open()
        yield j
        j.close()

    def test_append_then_read_returns_the_same_bytes_in_order(self, journal: Journal) -> None:
        """What is appended is read back byte for byte, in seq order."""
        history = sample_run()
        journal.append(history)
        stored = list(journal.read("run-1"))
        assert [ev.encode(e) for e in history] == [r.body for r in stored]
        assert [e.seq for e in history] == [r.seq for r in stored]

    def test_read_from_seq_returns_only_the_rest(self, journal: Journal) -> None:
        """read(run, after_seq) starts after the given sequence number."""
        journal.append(sample_run())
        assert [r.seq for r in journal.read("run-1", after_seq=3)] == [4, 5, 6, 7, 8]

    def test_batch_is_atomic(self, journal: Journal) -> None:
        """A batch with one bad event leaves nothing of the batch behind."""
        history = sample_run()
        journal.append(history[:2])
        bad = [*history[2:4], history[5]]  # skips seq 5: a gap inside the batch
        with pytest.raises(SequenceGap):
            journal.append(bad)
        assert [r.seq for r in journal.read("run-1")] == [1, 2]
        journal.append(history[2:])  # and the journal still accepts the right continuation
        assert len(history) == len(list(journal.read("run-1")))

    def test_duplicate_with_same_bytes_is_a_no_op(self, journal: Journal) -> None:
        """Re-appending an event already stored with the same bytes changes nothing."""
        history = sample_run()
        journal.append(history)
        again = journal.append(history[2:4])
        assert [r.seq for r in again] == [3, 4]
        assert len(history) == len(list(journal.read("run-1")))

    def test_duplicate_with_different_bytes_is_a_conflict(self, journal: Journal) -> None:
        """The same (run, seq) with other bytes is refused, and the stored event stays."""
        history = sample_run()
        journal.append(history)
        changed = ev.StepEffected(run_id="run-1", seq=3, ts=1, step_id="s0", receipt={"n": 99})
        with pytest.raises(EventConflict):
            journal.append([changed])
        assert ev.encode(history[2]) == next(iter(journal.read("run-1", after_seq=2))).body

    def test_same_step_phase_attempt_at_another_seq_is_a_conflict(self, journal: Journal) -> None:
        """The dedup key (run, step, phase, attempt) is a database constraint."""
        history = sample_run()
        journal.append(history[:4])  # s0 requested + effected
        dup = ev.StepEffected(run_id="run-1", seq=5, ts=2, step_id="s0", receipt={"n": 0})
        with pytest.raises(EventConflict):
            journal.append([dup])
        assert journal.head("run-1")[0] == 4

    def test_gap_is_refused(self, journal: Journal) -> None:
        """An event must continue its run's sequence."""
        history = sample_run()
        with pytest.raises(SequenceGap):
            journal.append([history[1]])
        assert list(journal.read("run-1")) == []

    @pytest.mark.parametrize("sql", ["UPDATE events SET body = body", "DELETE FROM events"])
    def test_database_rejects_update_and_delete(self, backend: JournalBackend, journal: Journal, sql: str) -> None:
        """Append-only is enforced by the database itself, not by convention."""
        journal.append(sample_run())
        with pytest.raises(Exception, match="append-only"):
            backend.raw_sql(sql)
        assert len(list(journal.read("run-1"))) == 8

    def test_hash_chain_links_every_event(self, journal: Journal) -> None:
        """Each stored hash is H(previous hash || stored bytes), from GENESIS, per run."""
        journal.append(sample_run("a"))
        journal.append(sample_run("b", steps=1))
        for run_id in ("a", "b"):
            prev = GENESIS
            for rec in journal.read(run_id):
                assert journal.chain.link(prev, rec.body) == rec.hash
                prev = rec.hash
            assert (rec.seq, prev) == journal.head(run_id)
            assert run_id == replay_records(journal.read(run_id), journal.chain, run_id=run_id).run_id

    def test_read_returns_the_index_columns_as_stored(self, journal: Journal) -> None:
        """read() gives each row's step_id, phase and attempt columns (the dedup key) as stored,
        so the replay can compare them with the body; a backend without them gives ``None``."""
        history = sample_run()
        journal.append(history)
        columns = [(r.step_id, r.phase, r.attempt) for r in journal.read("run-1")]
        expected = [(e.step_key, e.phase, e.attempt_no) for e in history]
        assert columns in (expected, [(None, None, None)] * len(history))

    def test_runs_lists_each_run_once(self, journal: Journal) -> None:
        """runs() lists every run with events, sorted."""
        journal.append(sample_run("b", steps=1))
        journal.append(sample_run("a", steps=1))
        assert journal.runs() == ["a", "b"]

    def test_runs_interleave_in_one_batch(self, journal: Journal) -> None:
        """A batch may hold events of several runs; each run keeps its own chain."""
        a, b = sample_run("a", steps=1), sample_run("b", steps=1)
        journal.append([x for pair in zip(a, b, strict=True) for x in pair])
        assert len(a) == len(list(journal.read("a")))
        assert len(b) == journal.head("b")[0]

    def test_errors_are_effectlog_errors(self, journal: Journal) -> None:
        """Backend failures surface as effectlog's own errors, never driver exceptions."""
        with pytest.raises(EffectlogError):
            journal.append([sample_run()[2]])

    # -- one owner per run --------------------------------------------------------------

    def test_a_claimed_run_refuses_every_other_writer_and_names_its_owner(
        self, backend: JournalBackend, journal: Journal
    ) -> None:
        """While one journal object owns a run, another's claim and append are refused (RunOwned), nothing is
        written, and ``owner`` names the live owner; other runs stay writable by anyone."""
        other = backend.open()
        try:
            claim = journal.claim("owned")
            journal.append(sample_run("owned")[:1])
            with pytest.raises(RunOwned):
                other.claim("owned")
            with pytest.raises(RunOwned):
                other.append([sample_run("owned")[1]])
            assert 1 == journal.head("owned")[0]
            found = other.owner("owned")
            assert (True, os.getpid()) == (found.live, found.owner.pid if found.owner else None)
            other.append(sample_run("free")[:1])  # another run of the same journal
            journal.release(claim)
            assert not other.owner("owned").live
            other.append([sample_run("owned")[1]])
            assert 2 == journal.head("owned")[0]
        finally:
            other.close()

    def test_one_object_cannot_claim_a_run_twice(self, journal: Journal) -> None:
        """Two actors of one process never both own a run: the second claim is refused until the first is released."""
        claim = journal.claim("twice")
        with pytest.raises(RunOwned):
            journal.claim("twice")
        journal.release(claim)
        journal.release(claim)  # releasing twice is harmless
        journal.release(journal.claim("twice"))

    # -- open-run checkpoint segments (effectlog.journal.checkpoint), for backends that keep them --

    @staticmethod
    def _segmented(journal: Journal, run_id: str = "ck") -> Any:
        """An open run of 3 steps appended in batches, a segment with each batch; the journal's full replay."""
        from effectlog.fold import apply, initial
        from effectlog.journal import checkpoint, load_run

        if not isinstance(journal, checkpoint.CheckpointJournal):
            pytest.skip("this backend keeps no checkpoint segments")
        history = sample_run(run_id, steps=3)[:-1]  # still open: no run.completed
        state = initial(run_id)
        for batch in (history[:2], history[2:5], history[5:6], history[6:]):
            for event in batch:
                state = apply(state, event)
            changed = {e.step_id for e in batch if isinstance(e, ev.StepEvent)}
            journal.append_checkpointed(batch, (), [checkpoint.segment_row(state, changed)])
        return journal, load_run(journal, run_id)

    def test_checkpoint_segments_fold_into_the_state_the_replay_gives(self, journal: Journal) -> None:
        """Segments bound to the chain, folded, then the events after the last one replayed from its
        event's hash, equal the full replay (the plan aside: a resume takes it from its Plan)."""
        import msgspec

        from effectlog.fold import replay_records_fast
        from effectlog.journal import checkpoint

        store, full = self._segmented(journal)
        base = checkpoint.load(store.checkpoint_rows("ck"), store.chain, "ck")
        assert base is not None
        assert [2, 5, 6, 10] == [seq for _, seq, _, _, _ in store.stored_checkpoints("ck")]
        base = msgspec.structs.replace(base, plan=full.plan, plan_steps=full.plan_steps)
        assert full == replay_records_fast(store.read("ck", base.seq), store.chain, base, run_id="ck")

    def test_the_last_checkpoint_row_is_the_last_of_the_runs_rows(self, journal: Journal) -> None:
        """``last_checkpoint_row`` (what a resume reads) is exactly the last row ``checkpoint_rows``
        gives, its event's hash included; none for a run without segments."""
        store, _ = self._segmented(journal)
        last = getattr(store, "last_checkpoint_row", None)
        if last is None:
            pytest.skip("this backend reads every segment on resume")
        assert store.checkpoint_rows("ck")[-1:] == last("ck")
        assert [] == last("nobody")

    def test_a_checkpoint_must_follow_its_runs_last_event(self, journal: Journal) -> None:
        """A segment names its run's head after the batch; any other seq refuses the whole batch."""
        from effectlog.fold import initial, replay
        from effectlog.journal import checkpoint

        if not isinstance(journal, checkpoint.CheckpointJournal):
            pytest.skip("this backend keeps no checkpoint segments")
        history = sample_run("gap", steps=1)
        stale = checkpoint.segment_row(replay(history[:1], initial("gap")), [])
        with pytest.raises(SequenceGap):
            journal.append_checkpointed(history[:3], (), [stale])
        assert ([], []) == (list(journal.read("gap")), journal.stored_checkpoints("gap"))

    def test_a_batch_appended_again_with_its_segment_is_a_no_op(self, journal: Journal) -> None:
        """Re-appending a stored batch with the same segment changes nothing (as for its events);
        a different segment at that seq is a conflict and writes nothing."""
        from effectlog.errors import EventConflict
        from effectlog.fold import initial, replay
        from effectlog.journal import checkpoint

        store, _ = self._segmented(journal)
        history = sample_run("ck", steps=3)[:-1]
        state = replay(history, initial("ck"))
        again = checkpoint.segment_row(state, {e.step_id for e in history[6:] if isinstance(e, ev.StepEvent)})
        before = store.stored_checkpoints("ck")
        store.append_checkpointed(history[6:], (), [again])
        assert before == store.stored_checkpoints("ck")
        with pytest.raises(EventConflict):
            store.append_checkpointed(history[6:], (), [checkpoint.segment_row(state, [])])
        assert before == store.stored_checkpoints("ck")

    @pytest.mark.parametrize("sql", ["UPDATE checkpoints SET body = body", "DELETE FROM checkpoints"])
    def test_database_rejects_update_and_delete_of_checkpoints(
        self, backend: JournalBackend, journal: Journal, sql: str
    ) -> None:
        """Segments are append-only in the database, like events."""
        store, _ = self._segmented(journal)
        with pytest.raises(Exception, match="append-only"):
            backend.raw_sql(sql)
        assert 4 == len(store.stored_checkpoints("ck"))

    def test_verify_checks_every_segment_and_names_an_edited_one(
        self, backend: JournalBackend, journal: Journal
    ) -> None:
        """``verify`` passes the segments written with their batches, and names the column of a segment
        whose stored hash was changed behind effectlog's back."""
        from effectlog.errors import ChainBroken
        from effectlog.integrity import verify_run

        store, full = self._segmented(journal)
        assert full == verify_run(store, "ck")
        # The append-only trigger's name differs per backend (PostgreSQL, SQLite): drop whichever exists.
        drops = ("DROP TRIGGER checkpoints_append_only ON checkpoints", "DROP TRIGGER checkpoints_append_only_update")
        for sql in drops:
            with contextlib.suppress(Exception):
                backend.raw_sql(sql)
        backend.raw_sql("UPDATE checkpoints SET hash = prev WHERE seq = 5")
        with pytest.raises(ChainBroken) as info:
            verify_run(store, "ck")
        assert ("checkpoints.hash", 5) == (info.value.fields["column"], info.value.seq)


def run_crash_matrix(
    adapter: str,
    ledger: str,
    workdir: Any,
    *,
    jobs: int = 1,
    args: dict[str, Any] | None = None,
    idempotent: bool = True,
) -> tuple[Any, list[str]]:
    """Run the crash matrix against your own adapter from your pytest suite.

    ``adapter`` is ``"module:factory"`` (``factory(decl, context) -> adapter``) and
    ``ledger`` is ``"module:counter"`` (``counter(run_id, step_id) -> int``, counting
    effects in *your* tool's own records). Returns ``(report, problems)``; an adapter
    that honours its idempotency contract gives no problems::

        report, problems = run_crash_matrix("myapp.tools:make_adapter", "myapp.tools:count", tmp_path)
        assert [] == problems

    ``args`` are the step's args (your adapter's own; default a payment's). With
    ``idempotent=False`` the adapter is declared not idempotent and every crash that
    leaves the step uncertain is reconciled through the adapter's own ``lookup``
    (``effectlog reconcile --lookup``, a separate process) before the run resumes.
    """
    from pathlib import Path

    from effectlog.crashmatrix.report import verify
    from effectlog.crashmatrix.runner import Target, run_matrix

    report = run_matrix(
        Path(workdir),
        [Target(backend="sqlite")],
        jobs=jobs,
        user_adapter=adapter,
        ledger_spec=ledger,
        args=args,
        idempotent=idempotent,
    )
    return report, verify(report)
