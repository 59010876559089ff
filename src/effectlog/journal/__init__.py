"""Journals: the storage Protocol and its backends, opened by location."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import zlib
from collections.abc import Iterator, Sequence
from typing import cast

import immutables
import msgspec

from effectlog import spelling
from effectlog.chain import Chain
from effectlog.errors import UnknownRun
from effectlog.fold import Record, Row, RunState, StepState, replay_records_fast, replay_rows
from effectlog.journal import checkpoint, sidecars
from effectlog.journal import frontier as fr
from effectlog.journal.checkpoint import CheckpointJournal, is_checkpointing
from effectlog.journal.protocol import SCHEMA_VERSION, Journal
from effectlog.journal.sqlite import SqliteJournal
from effectlog.outcome import StepSummary
from effectlog.plan import Plan
from effectlog.seal import SealingJournal, check_bound, closed_summary, is_sealing, state_from_seal

__all__ = [
    "SCHEMA_VERSION",
    "Journal",
    "SqliteJournal",
    "chain_from_env",
    "load_closed",
    "load_for_resume",
    "load_resumable",
    "load_run",
    "load_sealed",
    "no_such_run",
    "open_journal",
    "refuse_cut",
    "resume_point",
    "stored_rows",
]


def chain_from_env(key_file: str | None = None) -> Chain:
    """The chain to use: HMAC with the key of ``key_file`` (``--key-file``) or else of
    ``EFFECTLOG_JOURNAL_KEY``, plain SHA-256 when neither is given.

    Both sources are bytes, normalised one way (``_key_bytes``): ``key\\n`` in the environment was
    another key than the same line in a file. A source that is given but holds no key (an empty file,
    the variable set to ``""`` as ``=$(cat missing-file)`` sets it) is bad input, never "no key": a
    writer would create an unkeyed journal.
    """
    from effectlog.errors import BadInput

    if key_file:
        try:
            with open(key_file, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            raise BadInput(f"--key-file {key_file}: {exc.strerror}") from None
        key = _key_bytes(raw)
        if not key:
            raise BadInput(f"--key-file {key_file}: the key file is empty")
        return Chain(key)
    # The environment's bytes, as --key-file's: a key that is not UTF-8 has no str.encode()
    env = os.environb.get(b"EFFECTLOG_JOURNAL_KEY")
    if env is None:
        return Chain()
    key = _key_bytes(env)
    if not key:
        raise BadInput(
            "EFFECTLOG_JOURNAL_KEY is set but empty (or only whitespace): give the key, or unset it for a "
            "journal without a key"
        )
    return Chain(key)


def _key_bytes(raw: bytes) -> bytes:
    """The key a source spells: its bytes without leading and trailing ASCII whitespace (space, tab, CR,
    LF, VT, FF), so a file's final newline and an environment value's stray space name the same key.
    Bytes inside the key are kept as they are. (``Chain(key)`` in Python takes the bytes as given.)"""
    return raw.strip()


def open_journal(location: str, *, writer: bool = True, chain: Chain | None = None) -> Journal:
    """Open the journal at ``location``: a file path, or a ``postgresql://`` URL."""
    if sidecars.is_postgres(location):
        from effectlog.journal.postgres import PostgresJournal  # optional backend

        return PostgresJournal(location, writer=writer, chain=chain)
    return SqliteJournal(location, writer=writer, chain=chain)


def no_such_run(journal: Journal, run_id: str, location: str | None = None, *, tagged: bool = True) -> UnknownRun:
    """``UnknownRun`` for ``run_id``, naming a run of the journal that is the same id in another Unicode
    spelling (``café`` composed, given decomposed), which every listing shows alike, if there is one.
    ``tagged``: the error carries the run id (its line then begins ``run 'ID':``), as each caller's did."""
    shown = location if location is not None else journal.location
    tag = run_id if tagged else None
    other = spelling.twin(run_id, journal.runs())
    if other is None:
        return UnknownRun(f"no run {run_id!r} in {shown}", run_id=tag)
    return UnknownRun(
        f"no run {run_id!a} in {shown}, but {other!a} is, the same id in another Unicode spelling (composed "
        "against decomposed accents, or an invisible character): give it as that run has it (copy it from "
        "effectlog status); nothing was written",
        run_id=tag,
    )


def load_run(journal: Journal, run_id: str) -> RunState:
    """Replay one run from the journal, checking chain, sequence and legality."""
    with _no_cyclic_gc():
        rows = stored_rows(journal, run_id)
        if rows is not None:
            return replay_rows(rows, journal.chain, run_id=run_id)
        return replay_records_fast(journal.read(run_id), journal.chain, run_id=run_id)


def stored_rows(journal: Journal, run_id: str) -> Iterator[Row] | None:
    """The run's rows as ``fold.fold_rows`` takes them, from a journal that reads them without a
    ``Record`` each (SQLite's and PostgreSQL's ``read_rows``), when its ``read`` is that journal's
    own (a subclass that changes ``read`` is read through it); ``None`` otherwise: read its records."""
    if isinstance(journal, SqliteJournal) and type(journal).read is SqliteJournal.read:
        return journal.read_rows(run_id)
    postgres = sys.modules.get("effectlog.journal.postgres")  # the optional backend: loaded once one is open
    if postgres is not None and type(journal) is postgres.PostgresJournal:
        rows: Iterator[Row] = journal.read_rows(run_id)  # type: ignore[attr-defined]
        return rows
    return None


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector for a replay.

    A long replay keeps many acyclic objects alive (steps, receipts, map nodes), and the
    collector would re-scan them all again and again: about a fifth of the replay's time at
    100,000 events. Nothing a replay creates is cyclic, reference counting still frees as
    usual, and the collector resumes (if it was on) as soon as the replay ends.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class ResumePoint(msgspec.Struct, frozen=True, kw_only=True):
    """Where an open run's actor starts: its state, the seq of its last checkpoint segment, the steps
    changed since (what its next segment must carry), the frontier tracker its segments continue,
    and ``skip``: how many of the plan's first steps are done (the actor starts its walk there)."""

    state: RunState
    segment_seq: int
    touched: set[str]
    tracker: fr.Tracker
    skip: int = 0


def load_for_resume(journal: Journal, run_id: str, plan: Plan) -> tuple[RunState, int, set[str]]:
    """An open run's state (``resume_point``, its step map loaded in full so that it outlives the
    journal), its last segment's seq and the steps touched since."""
    point = resume_point(journal, run_id, plan)
    return fr.loaded(point.state), point.segment_seq, point.touched


def resume_point(journal: Journal, run_id: str, plan: Plan) -> ResumePoint:
    """An open run's state for its actor, from the cheapest sound source:

    1. its last checkpoint segment, when it carries a frontier (``journal/frontier.py``), is bound
       to its event and was written for ``plan``: the state there with a lazy step map, plus the
       events after it (their chain checked from the segment's event);
    2. else all its segments (``checkpoint.load``) plus the events after the last one;
    3. else ``load_run`` (the full replay, which checks the whole chain).
    """
    ids = fr.PlanIds(plan.steps)
    if is_checkpointing(journal):  # (isinstance, once per class)
        last_row = getattr(journal, "last_checkpoint_row", None)
        if last_row is not None:
            row = last_row(run_id)
            _check_segments_not_cut(journal, row, run_id)
            found = checkpoint.load_last(row, journal.chain, run_id)
            if found is not None:
                segment, head = found
                front = segment.frontier
                if (
                    front is not None
                    and segment.kind == "plan"
                    and segment.plan_digest == plan.digest
                    and front.prefix <= len(ids)
                    and front.consistent()
                ):
                    steps = fr.LazySteps.at(front, ids, plan.positions, lambda: _all_steps(journal, run_id))
                    start = checkpoint.state_at(segment, head, steps)
                    return _tail(journal, run_id, plan, start, tracker=fr.Tracker.of(ids, front), skip=front.prefix)
        rows = cast("CheckpointJournal", journal).checkpoint_rows(run_id)
        _check_segments_not_cut(journal, rows, run_id)
        with _no_cyclic_gc():
            base = checkpoint.load(rows, journal.chain, run_id)
        if base is not None and base.kind == "plan" and base.plan_digest == plan.digest:
            point = _tail(journal, run_id, plan, base, tracker=fr.Tracker(ids), skip=0)
            return _with_full_tracker(point, ids)
    state = load_run(journal, run_id)
    point = ResumePoint(state=state, segment_seq=0, touched=set(state.steps.keys()), tracker=fr.Tracker(ids))
    return _with_full_tracker(point, ids)


def _with_full_tracker(point: ResumePoint, ids: fr.PlanIds) -> ResumePoint:
    """A state loaded in full (no frontier to start from): the tracker learns every step once, here."""
    state = point.state
    tracker, _ = fr.Tracker(ids).advance(state, set(state.steps.keys()))
    return msgspec.structs.replace(point, tracker=tracker, skip=tracker.prefix)


def _tail(journal: Journal, run_id: str, plan: Plan, base: RunState, *, tracker: fr.Tracker, skip: int) -> ResumePoint:
    """``base`` (a segment's state) with ``plan`` and the events after it replayed."""
    base = msgspec.structs.replace(base, plan=plan.pinned(), plan_steps=plan.step_ids)
    touched: set[str] = set()

    def tail() -> Iterator[Record]:
        for rec in journal.read(run_id, base.seq):
            touched.add(rec.step_id or "")
            yield rec

    with _no_cyclic_gc():
        state = replay_records_fast(tail(), journal.chain, base, run_id=run_id)
    touched.discard("")
    return ResumePoint(state=state, segment_seq=base.seq, touched=touched, tracker=tracker, skip=skip)


def _all_steps(journal: Journal, run_id: str) -> immutables.Map[str, StepState]:
    """Every step of the run as its segments record them, or its full replay when a segment does not
    link (which raises on a damaged journal): what a lazy step map loads its done steps from."""
    assert isinstance(journal, CheckpointJournal)
    with _no_cyclic_gc():
        state = checkpoint.load(journal.checkpoint_rows(run_id), journal.chain, run_id)
    return state.steps if state is not None else load_run(journal, run_id).steps


def refuse_cut(journal: Journal, run_id: str) -> None:
    """``Truncated`` (exit 7) when the run's tail was cut under its seal or its last checkpoint
    segment (each written in the transaction of the event it names): what a writer other than the
    run's actor (an operator's decision, a repin) checks before it appends, so that nothing is
    written over a cut. A decision appended there would also hide the cut from the next resume:
    the segment's seq would exist again, as another event."""
    load_sealed(journal, run_id)
    if is_checkpointing(journal):  # (isinstance, once per class)
        _check_segments_not_cut(journal, cast("CheckpointJournal", journal).checkpoint_rows(run_id), run_id)


def _check_segments_not_cut(
    journal: Journal, rows: list[tuple[int, bytes, bytes, bytes, bytes | None]], run_id: str
) -> None:
    if rows and rows[-1][4] is None:  # the last segment's event is gone: cut from the end?
        checkpoint.check_not_cut(rows, journal.head(run_id), run_id)


def load_resumable(journal: Journal, run_id: str) -> RunState:
    """The state a run actor starts from: a closed run's seal when it has one, else ``load_run``.

    A sealed run is closed for good, so its actor only reports it; the seal (bound to the
    run's chain head) has every run-level field and each step's id, state and attempt. A
    seal no longer bound to the run's last event (a cut tail, an edited last event) raises
    ``Truncated`` or ``ChainBroken``: the run is not re-driven from what is left.
    """
    sealed = load_sealed(journal, run_id)
    return sealed if sealed is not None else load_run(journal, run_id)


def load_closed(journal: Journal, run_id: str) -> tuple[RunState, Sequence[StepSummary]] | None:
    """A closed run's report from its seal (``seal.closed_summary``: run-level fields, and step rows
    built when first read, no step states); ``None`` without a usable seal. Raises as ``load_sealed`` does."""
    if not is_sealing(journal):  # (isinstance, once per class)
        return None
    found = cast("SealingJournal", journal).sealed(run_id)
    if found is not None:
        try:
            with _no_cyclic_gc():  # 33k rows: a full collection over the caller's heap cost ~7 ms
                return closed_summary(*found)
        except (zlib.error, msgspec.DecodeError, msgspec.ValidationError):
            return None
    for stored in cast("SealingJournal", journal).stored_seals(run_id):
        check_bound(stored, journal.head(run_id), journal.chain)
    return None


def load_sealed(journal: Journal, run_id: str) -> RunState | None:
    """A closed run's summary from its seal; ``None`` when there is no usable seal.

    Raises ``Truncated``/``ChainBroken`` when the run has a seal no longer bound to its
    last event (see ``load_resumable``).
    """
    if not is_sealing(journal):  # (isinstance, once per class)
        return None
    found = cast("SealingJournal", journal).sealed(run_id)
    if found is not None:
        try:
            return state_from_seal(*found)
        except (zlib.error, msgspec.DecodeError, msgspec.ValidationError):
            return None  # a seal that does not decode is no shortcut: replay in full
    # a seal no longer bound: the tail was cut or edited
    for stored in cast("SealingJournal", journal).stored_seals(run_id):
        check_bound(stored, journal.head(run_id), journal.chain)
    return None
