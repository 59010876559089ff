"""``verify``: every stored byte of a journal is either hashed or re-derived and compared.

Events: the chain covers each body; the replay compares the row's ``run_id``, ``seq``,
``step_id``, ``phase`` and ``attempt`` columns with what the body says
(``fold.replay_records``). Checkpoint segments of open runs (SQLite, ``journal.checkpoint``):
each must link to its event and to the previous segment, decode, name its row and equal the
replay at its seq (``check_segments``). Seals (SQLite): each seals row must name its run's
last event, link to it, decode, and agree with the full replay (``seal.check_seal``); a seal
of a run that has no events left is a cut run. Both backends share this one path.
"""

from __future__ import annotations

from itertools import chain as chained

from effectlog.errors import RequestServedTwice, Truncated
from effectlog.events import RunStarted, decode
from effectlog.fold import Record, RunState, fold_rows, initial, replay_records, rows_of
from effectlog.journal import Journal, _no_cyclic_gc, load_run, stored_rows
from effectlog.journal.checkpoint import CheckpointJournal, StoredSegment, check_segments
from effectlog.seal import SealingJournal, check_seal


def verify_run(journal: Journal, run_id: str) -> RunState:
    """Replay and check one run, its checkpoint segments and its seal; raises an ``IntegrityError``
    naming run, seq and column."""
    # The seal and the checkpoints first, then the events: both are written in the transaction of
    # the event they are bound to, so events read after them reach that event. Read the other way
    # round, a run closed by a writer between the two reads would look cut (verify runs beside
    # writers: G6).
    seals = journal.stored_seals(run_id) if isinstance(journal, SealingJournal) else []
    segments = journal.stored_checkpoints(run_id) if isinstance(journal, CheckpointJournal) else []
    # The seal's check too with the cyclic GC paused (as the replay is: ``_no_cyclic_gc``): it decodes a
    # step row per step of the run, and collections over everything the replay keeps alive cost three
    # times the check itself at 100k events.
    with _no_cyclic_gc():
        state = load_run(journal, run_id) if not segments else _replay_checking_segments(journal, run_id, segments)
        for stored in seals:
            check_seal(stored, state, journal.chain)
    return state


def _replay_checking_segments(journal: Journal, run_id: str, segments: list[StoredSegment]) -> RunState:
    """The full replay, one pass over the rows (``fold.fold_rows``), paused at each segment's seq to
    compare the segment with the state there and the steps changed since the previous one."""
    rows = stored_rows(journal, run_id)
    records = iter(journal.read(run_id)) if rows is None else iter(())
    stray: list[Record] = []  # a record of another run, from a journal's own ``read``: see ``fold.rows_of``
    folding = fold_rows(
        rows if rows is not None else rows_of(records, run_id, stray),
        journal.chain,
        initial(run_id),
        run_id=run_id,
        stops=[segment[1] for segment in segments],
    )
    final: list[RunState] = []

    def advance(seq: int) -> tuple[RunState, set[str]] | None:
        if not final:
            try:
                state, touched = next(folding)
                return (state, touched) if state.seq == seq else None
            except StopIteration as done:
                final.append(done.value)
        if stray:  # the reference's error for it (or its state, and no stop left to reach)
            final[0] = replay_records(chained(stray, records), journal.chain, final[0], run_id=run_id)
            stray.clear()
        return None

    check_segments(segments, advance, journal.chain)
    while not final:  # every segment was reached: the rows after the last one
        try:
            next(folding)
        except StopIteration as done:
            final.append(done.value)
    if stray:
        return replay_records(chained(stray, records), journal.chain, final[0], run_id=run_id)
    return final[0]


def check_orphan_seals(journal: Journal, run_ids: list[str], only: str | None = None) -> None:
    """A seal or a checkpoint segment whose run has no event left (of all runs, or of ``only``): the
    whole run was cut (each is written in the transaction of the event it names)."""
    seals = journal.stored_seals(only) if isinstance(journal, SealingJournal) else []
    segmented = journal.checkpointed_runs() if isinstance(journal, CheckpointJournal) else []
    segmented = [(run_id, seq) for run_id, seq in segmented if only is None or run_id == only]
    # Runs listed after the seals and segments were read (see verify_run): a run started and
    # sealed (or checkpointed) by a writer after ``run_ids`` was listed is no orphan.
    known = set(run_ids) | (set(journal.runs()) if seals or segmented else set())
    for run_id, seq, _, _ in seals:
        if run_id not in known:
            raise Truncated(
                f"the run is sealed at seq {seq} but the journal holds none of its events", run_id=run_id, seq=0
            )
    for run_id, seq in segmented:
        if run_id not in known:
            raise Truncated(
                f"the run has a checkpoint written with its event seq {seq} but the journal holds none of its "
                "events: the whole run was cut",
                run_id=run_id,
                seq=0,
                column="checkpoints.seq",
            )


def check_requests(journal: Journal, run_ids: list[str]) -> None:
    """No fleet request is served by two runs: each run's ``run.started`` names the request it serves
    (``RunStarted.request``, 0 outside a fleet), and a request owns one run. The fleet's tables are
    outside the chain; this is the chain's own word on which request each run served."""
    served: dict[int, str] = {}
    first_body = getattr(journal, "first_body", None)  # one row; ``read`` would fetch a run (or a page) again
    for run_id in run_ids:
        if first_body is not None:
            body = first_body(run_id)
        else:
            first = next(iter(journal.read(run_id)), None)
            body = first.body if first is not None and first.seq == 1 else None
        started = decode(body) if body is not None else None
        if not isinstance(started, RunStarted) or started.request == 0:
            continue
        other = served.setdefault(started.request, run_id)
        if other != run_id:
            raise RequestServedTwice(
                f"fleet request {started.request} is served by two runs, {other!r} and {run_id!r}: its steps were "
                "started again under a new run id (a request's row edited by hand?); see docs/fleet.md",
                run_id=run_id,
                seq=1,
            )
