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

from itertools import islice

from effectlog.errors import Truncated
from effectlog.fold import RunState, initial, replay_records_fast
from effectlog.journal import Journal, _no_cyclic_gc, load_run
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
    if not segments:
        state = load_run(journal, run_id)
    else:
        with _no_cyclic_gc():
            state = _replay_checking_segments(journal, run_id, segments)
    for stored in seals:
        check_seal(stored, state, journal.chain)
    return state


def _replay_checking_segments(journal: Journal, run_id: str, segments: list[StoredSegment]) -> RunState:
    """The full replay, paused at each segment's seq to compare the segment with the state there."""
    records = iter(journal.read(run_id))
    state = initial(run_id)

    def advance(seq: int) -> tuple[RunState, set[str]] | None:
        nonlocal state
        chunk = list(islice(records, max(0, seq - state.seq)))  # one read, cut at each segment
        state = replay_records_fast(chunk, journal.chain, state, run_id=run_id)
        return (state, {r.step_id or "" for r in chunk}) if state.seq == seq else None

    check_segments(segments, advance, journal.chain)
    return replay_records_fast(records, journal.chain, state, run_id=run_id)


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
